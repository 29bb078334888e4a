/* idemgate: orchestration only. Load the configuration, start the subsystems in order, wait for
 * a signal, stop them in order: stop accepting → answer waiting clients → drain → stop the HTTP
 * server → free what its handlers used → stop the workers → close the store. */
#include "idemgate/cli.h"
#include "idemgate/config.h"
#include "idemgate/dispatcher.h"
#include "idemgate/api.h"
#include "idemgate/http_server.h"
#include "idemgate/jobcache.h"
#include "idemgate/log.h"
#include "idemgate/migrate.h"
#include "idemgate/poller.h"
#include "idemgate/reaper.h"
#include "idemgate/reconciler.h"
#include "idemgate/routes.h"
#include "idemgate/store.h"
#include "idemgate/upstream.h"
#include "idemgate/waiters.h"

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
            "  migrate          apply database migrations and exit\n"
            "  check-config     validate the configuration and exit (0 ok, 1 invalid)\n"
            "  config-reference print every setting with its environment variable\n"
            "  tenant add NAME | list | revoke NAME\n"
            "  jobs list [--state S] | show ID | resolve ID found|absent|abandon\n"
            "\n"
            "The configuration file may also be named by IDEMGATE_CONFIG; every setting can be\n"
            "overridden by its environment variable (DATABASE_URL, IDEMGATE_LISTEN, …).\n");
}

static int serve(const struct cfg *cfg)
{
    sigset_t set;
    int sig = 0;
    const char *step = "libcurl";
    struct waiters *w = NULL;
    struct api *api = NULL;
    struct hs_server *http = NULL;
    struct dispatcher *disp = NULL;
    struct reaper *reaper = NULL;
    struct wpool *recon = NULL, *poller = NULL;

    /* Signals go to the main thread only: every thread started below inherits this mask. */
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (up_global_init() < 0)
        goto failed;
    step = "migrations";
    struct db *db = store_db_open(cfg->database_url);
    if (!db)
        goto failed;
    /* An unreachable database is not fatal: /readyz says so and the reaper retries. */
    if (migrate_run(db) < 0)
        LOG(LOG_WARN, "migrations_pending", LS("note", "database unreachable or migration failed"));
    store_db_close(db);
    step = "job cache";
    if (jobcache_init((size_t)cfg->job_cache_entries, cfg->job_cache_ttl_ms) < 0)
        goto failed;
    step = "waiters";
    if (!(w = waiters_start(cfg)))
        goto failed;
    step = "dispatcher";
    if (!(disp = disp_start(cfg)))
        goto failed;
    step = "reconciler";
    if (!(recon = recon_start(cfg)))
        goto failed;
    step = "poller";
    if (!(poller = poller_start(cfg)))
        goto failed;
    step = "reaper";
    reaper = reaper_start(cfg);
    if (cfg->reaper_interval_ms && !reaper)
        goto failed;
    step = "http";
    if (!(api = api_new(cfg, w)) || !(http = routes_listen(api)))
        goto failed;
    LOG(LOG_INFO, "listening", LS("host", cfg->listen_host), LI("port", cfg->listen_port),
        LI("dispatch_workers", cfg->dispatch_workers), LS("instance", cfg->instance_id));
    fprintf(stdout, "idemgate listening on %s:%d\n", cfg->listen_host, cfg->listen_port);
    fflush(stdout);

    sigwait(&set, &sig);
    LOG(LOG_INFO, "shutdown", LS("signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"));
    /* HTTP first and entirely: until hs_stop returns, a request on a kept-alive connection
     * may still reach the waiters (Prefer: wait), the job cache and the API's per-thread
     * database connections, so none of them is freed before. */
    hs_quiesce(http);                 /* new connections are refused */
    waiters_close(w);                 /* waiting clients get the current state; no new waits */
    hs_drain(http, DRAIN_TIMEOUT_MS); /* requests in progress are answered */
    hs_stop(http);                    /* no server thread runs any more */
    api_free(api);                    /* the server threads' database connections */
    waiters_free(w);
    /* Then the workers: calls in flight finish and their results are written. */
    disp_stop(disp);
    wpool_stop(recon);
    wpool_stop(poller);
    reaper_stop(reaper);
    jobcache_fini();
    up_global_fini();
    LOG(LOG_INFO, "stopped", LS("instance", cfg->instance_id));
    return 0;
failed:
    LOG(LOG_ERROR, "start_failed", LS("step", step));
    hs_stop(http);
    api_free(api);
    waiters_free(w);
    disp_stop(disp);
    wpool_stop(recon);
    wpool_stop(poller);
    reaper_stop(reaper);
    return 1;
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
        rc = cli_migrate(cfg);
    else if (strcmp(cmd, "check-config") == 0)
        rc = cli_check_config(cfg);
    else if (strcmp(cmd, "tenant") == 0)
        rc = cli_tenant(cfg, argc - i, argv + i);
    else if (strcmp(cmd, "jobs") == 0)
        rc = cli_jobs(cfg, argc - i, argv + i);
    else {
        usage(stderr);
        rc = 2;
    }
    cfg_free(cfg);
    return rc;
}
