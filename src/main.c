/* idemgate: orchestration only. Load the configuration, start the subsystems in order, wait for
 * a signal, stop them in order: stop accepting → answer waiting clients → drain → stop the HTTP
 * server → free what its handlers used → stop the workers → stop the wake signaller. */
#include "idemgate/archive.h"
#include "idemgate/cli.h"
#include "idemgate/config.h"
#include "idemgate/credwatch.h"
#include "idemgate/dispatcher.h"
#include "idemgate/engine.h"
#include "idemgate/api.h"
#include "idemgate/http_server.h"
#include "idemgate/jobcache.h"
#include "idemgate/limits.h"
#include "idemgate/livestream.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/metrics_listener.h"
#include "idemgate/migrate.h"
#include "idemgate/offload.h"
#include "idemgate/poller.h"
#include "idemgate/reaper.h"
#include "idemgate/reconciler.h"
#include "idemgate/recorder.h"
#include "idemgate/routes.h"
#include "idemgate/store.h"
#include "idemgate/secrets.h"
#include "idemgate/tenants.h"
#include "idemgate/upstream.h"
#include "idemgate/waiters.h"
#include "idemgate/wake.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DRAIN_TIMEOUT_MS 5000

static void usage(FILE *out)
{
    fprintf(out,
            "usage: idemgate [--config FILE] COMMAND\n"
            "\n"
            "commands:\n"
            "  serve            run the gateway (applies migrations first)\n"
            "  migrate [--citus] apply database migrations (--citus: then distribute the schema\n"
            "                   on a Citus coordinator) and exit\n"
            "  check-config     validate the configuration and exit (0 ok, 1 invalid)\n"
            "  config-reference print every setting with its environment variable\n"
            "  tenant add NAME | list | revoke NAME\n"
            "  tenant limits NAME [--rps N] [--burst N] [--waits N]\n"
            "  tenant budget NAME [--currency C] [--day A|none] [--month A|none]\n"
            "                   [--in-flight N|none] | --clear\n"
            "  usage [--tenant NAME] [--from D] [--to D] [--group-by provider|route|day]\n"
            "  unreferenced SHA256...  archived objects no remaining job references\n"
            "  jobs list [--state S] [--limit N] | show ID\n"
            "  jobs resolve ID found --remote-id R | absent [--force] | abandon [--operator NAME]\n"
            "  statements       print every SQL statement the gateway prepares (JSON lines)\n"
            "\n"
            "The configuration file may also be named by IDEMGATE_CONFIG; every setting can be\n"
            "overridden by its environment variable (DATABASE_URL, IDEMGATE_LISTEN, …).\n");
}

/* Everything serve() starts, in start order. */
struct subsystems {
    struct waiters *waiters;
    struct recorder *recorder;
    struct eng *eng; /* the call engine the dispatcher and the poller make their calls on */
    struct credwatch *cw; /* whose credentials can be read here: the dispatcher's, the poller's */
    struct dispatcher *disp;
    struct poller *poller;
    struct reconciler *recon;
    struct archiver *archiver;
    struct reaper *reaper;
    struct api *api;
    struct offload *pool;
    struct hs_server *http;
    struct hs_server *metrics; /* the metrics listener, when metrics_listen is set */
    int curl, cache, wake;
};

/* A waiter's arg is its suspended request (intake.c). */
static int client_gone(void *arg)
{
    return hs_req_peer_closed(arg);
}

/* The call engine, with each provider's own limit of calls in flight. */
static struct eng *start_engine(const struct cfg *cfg)
{
    int *limits = calloc(cfg->n_providers + 1, sizeof(*limits));
    if (!limits)
        return NULL;
    for (size_t i = 0; i < cfg->n_providers; i++)
        limits[i] = cfg->providers[i].max_inflight_calls;
    struct eng *e =
        eng_start(cfg->call_threads, cfg->max_inflight_calls, limits, (int)cfg->n_providers);
    free(limits);
    return e;
}

/* Starts the subsystems in order; returns NULL, or the name of the step that failed (what did
 * start is in s, for stop_all). */
/* The providers' label set of the metrics, before any thread counts anything (the names are
 * the configuration's, which outlives every thread). */
static int metrics_start(const struct cfg *cfg)
{
    const char **names = calloc(cfg->n_providers + 1, sizeof(*names));
    const char **currencies = calloc(cfg->n_providers + 1, sizeof(*currencies));
    int e = names && currencies ? 0 : -1;
    for (size_t i = 0; e == 0 && i < cfg->n_providers; i++) {
        names[i] = cfg->providers[i].name;
        currencies[i] = cfg->providers[i].pricing.present ? cfg->providers[i].pricing.currency
                                                          : NULL;
    }
    if (e == 0)
        metrics_providers(names, currencies, cfg->n_providers);
    free(names);
    free(currencies);
    return e;
}

static const char *start_all(const struct cfg *cfg, struct subsystems *s)
{
    if (metrics_start(cfg) < 0)
        return "metrics";
    if (up_global_init() < 0)
        return "libcurl";
    s->curl = 1;
    struct db *db = store_db_open(cfg->database_url);
    if (!db)
        return "migrations";
    /* An unreachable database is not fatal: /readyz says so and the reaper retries. */
    int migrated = migrate_run(db);
    if (migrated < 0 && migrated != STORE_ECONFLICT) /* (a changed migration is logged itself) */
        LOG(LOG_WARN, "migrations_pending", LS("note", "database unreachable or migration failed"));
    /* The tenants' limits apply from the first request; then every LIMITS_REFRESH_S. */
    if (limits_init(cfg) < 0)
        return "tenant limits";
    limits_refresh(db);
    /* The tenant directory answers from the first request; then every TENANTS_REFRESH_S. */
    (void)tenants_refresh_due();
    tenants_refresh(db);
    store_db_close(db);
    if (jobcache_init((size_t)cfg->job_cache_entries, cfg->job_cache_ttl_ms,
                      (size_t)cfg->job_cache_bytes) < 0)
        return "job cache";
    char spool[1024];
    snprintf(spool, sizeof(spool), "%s", cfg->stream_spool_dir);
    if (!*spool)
        snprintf(spool, sizeof(spool), "%s/tmp", cfg->archive_dir);
    ls_configure((size_t)cfg->stream_memory_bytes, spool);
    s->cache = 1;
    /* Before anything that commits a state: the wake-ups of every write reach the others. */
    if (wake_start(cfg) < 0)
        return "wake signaller";
    s->wake = 1;
    if (!(s->waiters = waiters_start(cfg)))
        return "waiters";
    wake_on_done(waiters_job_done, s->waiters);
    waiters_on_gone(s->waiters, client_gone);
    if (!(s->eng = start_engine(cfg)))
        return "call engine";
    if (!(s->cw = cw_new(cfg)))
        return "credential watch";
    if (!(s->disp = disp_start(cfg, s->eng, s->cw)))
        return "dispatcher";
    if (!(s->recorder = recorder_start(cfg, s->disp)))
        return "recorder";
    if (!(s->recon = recon_start(cfg, s->eng)))
        return "reconciler";
    if (!(s->poller = poller_start(cfg, s->eng, s->cw)))
        return "poller";
    if (!(s->archiver = archive_start(cfg, s->eng)))
        return "archive workers";
    s->reaper = reaper_start(cfg);
    if (cfg->reaper_interval_ms && !s->reaper)
        return "reaper";
    if (!(s->pool = offload_start(cfg->db_workers)))
        return "database workers";
    if (!(s->api = api_new(cfg, s->waiters, s->recorder, s->pool)) ||
        !(s->http = routes_listen(s->api)))
        return "http";
    if (*cfg->metrics_listen_host && !(s->metrics = ml_listen(s->api)))
        return "metrics listener";
    return NULL;
}

/* Stops what start_all started. HTTP first and entirely: until hs_stop returns, a request on a
 * kept-alive connection may still reach the waiters (Prefer: wait), the job cache and the API's
 * per-thread database connections, so none of them is freed before. Then the workers: calls in
 * flight finish and their results are written; last the signaller, which tells the other
 * replicas of those results. */
static void stop_all(struct subsystems *s)
{
    offload_close(s->pool); /* queued database work is done and answered */
    hs_stop(s->http);       /* no server thread runs any more */
    hs_stop(s->metrics);
    offload_free(s->pool);
    api_free(s->api); /* the database workers' connections */
    /* From here the workers' results no longer reach the waiters. */
    wake_on_done(NULL, NULL);
    waiters_free(s->waiters);
    recorder_free(s->recorder);
    /* No new call starts; the calls in flight end (each within its provider's total timeout,
     * a create within its create_total_ms, its lease kept meanwhile) while the dispatcher's and
     * the poller's threads write their results; then those threads write what is left and
     * stop. No call in flight is dropped. */
    store_finish_stopping();
    disp_quiesce(s->disp);
    poller_quiesce(s->poller);
    recon_quiesce(s->recon);
    archive_quiesce(s->archiver);
    eng_stop(s->eng);
    disp_stop(s->disp);
    poller_stop(s->poller);
    recon_stop(s->recon);
    archive_stop(s->archiver);
    eng_free(s->eng);
    cw_free(s->cw); /* after the dispatcher's and the poller's threads */
    reaper_stop(s->reaper);
    if (s->wake)
        wake_stop();
    if (s->cache)
        jobcache_fini();
    limits_fini();
    tenants_fini();
    secrets_fini();
    if (s->curl)
        up_global_fini();
}

static int serve(const struct cfg *cfg)
{
    sigset_t set;
    int sig = 0;
    struct subsystems s = {0};

    /* Signals go to the main thread only: every thread started below inherits this mask. */
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    const char *failed = start_all(cfg, &s);
    if (failed) {
        LOG(LOG_ERROR, "start_failed", LS("step", failed));
        stop_all(&s);
        return 1;
    }
    LOG(LOG_INFO, "listening", LS("host", cfg->listen_host), LI("port", cfg->listen_port),
        LI("dispatch_workers", cfg->dispatch_workers), LS("instance", cfg->instance_id));
    if (s.metrics)
        LOG(LOG_INFO, "metrics_listening", LS("host", cfg->metrics_listen_host),
            LI("port", cfg->metrics_listen_port));
    fprintf(stdout, "idemgate listening on %s:%d\n", cfg->listen_host, cfg->listen_port);
    fflush(stdout);

    sigwait(&set, &sig);
    LOG(LOG_INFO, "shutdown", LS("signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"));
    hs_quiesce(s.http);                 /* new connections are refused */
    hs_quiesce(s.metrics);
    waiters_close(s.waiters);           /* waiting clients get the current state; no new waits */
    ls_wake_all();                      /* live streams' readers end their bodies, cut */
    recorder_close(s.recorder);         /* queued intents are recorded and answered; the rest of
                                           the drain records on the database workers */
    hs_drain(s.http, DRAIN_TIMEOUT_MS); /* requests in progress are answered */
    hs_drain(s.metrics, DRAIN_TIMEOUT_MS);
    stop_all(&s);
    LOG(LOG_INFO, "stopped", LS("instance", cfg->instance_id));
    return 0;
}

int main(int argc, char **argv)
{
    const char *config_path = getenv("IDEMGATE_CONFIG");
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            config_path = argv[++i];
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[i++];
    if (strcmp(cmd, "config-reference") == 0) {
        cfg_print_reference();
        return 0;
    }
    if (strcmp(cmd, "statements") == 0)
        return cli_statements();
    if (i < argc && strcmp(argv[i], "--help") == 0 && strcmp(cmd, "tenant") != 0 &&
        strcmp(cmd, "jobs") != 0) {
        usage(stdout);
        return 0;
    }
    char err[512];
    struct cfg *cfg = cfg_load(config_path, err, sizeof(err));
    if (!cfg) {
        fprintf(stderr, "idemgate: invalid configuration: %s\n", err);
        return 1;
    }
    (void)log_set_level_name(cfg->log_level);
    int rc;
    if (strcmp(cmd, "serve") == 0)
        rc = serve(cfg);
    else if (strcmp(cmd, "migrate") == 0)
        rc = cli_migrate(cfg, argc - i, argv + i);
    else if (strcmp(cmd, "check-config") == 0)
        rc = cli_check_config(cfg);
    else if (strcmp(cmd, "tenant") == 0)
        rc = cli_tenant(cfg, argc - i, argv + i);
    else if (strcmp(cmd, "jobs") == 0)
        rc = cli_jobs(cfg, argc - i, argv + i);
    else if (strcmp(cmd, "usage") == 0)
        rc = cli_usage(cfg, argc - i, argv + i);
    else if (strcmp(cmd, "unreferenced") == 0)
        rc = cli_unreferenced(cfg, argc - i, argv + i);
    else {
        usage(stderr);
        rc = 2;
    }
    cfg_free(cfg);
    return rc;
}
