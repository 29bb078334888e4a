#include "idemgate/reaper.h"

#include "idemgate/breaker.h"
#include "idemgate/clock.h"
#include "idemgate/log.h"
#include "idemgate/migrate.h"
#include "idemgate/provider.h"
#include "idemgate/retention.h"
#include "idemgate/lease.h"
#include "idemgate/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REAP_BATCH 100
/* How often a tripped provider's credential is probed, when its profile names a probe. */
#define PROBE_INTERVAL_S 30.0
/* Batches one retention sweep runs at most (retention.h). */
#define JANITOR_MAX_ROUNDS 20

struct reaper {
    const struct cfg *cfg;
    atomic_int stop;
    pthread_t thread;
};


struct probe_ctx {
    const struct cfg *cfg;
    struct db *db;
};

/* A cheap authenticated GET: a 2xx proves the credential works again and clears the breaker. */
static void probe_one(const char *provider, int status, const char *reason,
                      const char *tripped_at, void *arg)
{
    (void)status;
    (void)reason;
    (void)tripped_at;
    struct probe_ctx *x = arg;
    const struct cfg_provider *p = cfg_find_provider(x->cfg, provider, strlen(provider));
    int cleared = 0;
    if (p && breaker_probe(p, p->total_timeout_ms) == CLS_PROBE_OK &&
        store_breaker_reset(x->db, provider, &cleared) == STORE_OK && cleared)
        LOG(LOG_WARN, "provider_reset", LS("provider", provider), LS("by", "probe"));
}

/* One retention sweep: bounded batches while some kind fills its batch. */
static void sweep(struct db *db, int batch)
{
    long long deleted[RET__KINDS] = {0}, total[RET__KINDS] = {0};
    int round = 0;
    do {
        round++;
        if (store_janitor(db, batch, deleted) != STORE_OK)
            break;
        for (int k = 0; k < RET__KINDS; k++)
            total[k] += deleted[k];
    } while (ret_more(deleted, batch, round, JANITOR_MAX_ROUNDS));
    if (total[RET_OPERATIONS] || total[RET_WEBHOOK_EVENTS] || total[RET_PARKED])
        LOG(LOG_INFO, "retention_swept", LI("operations", total[RET_OPERATIONS]),
            LI("webhook_events", total[RET_WEBHOOK_EVENTS]), LI("parked", total[RET_PARKED]));
}

static void *reaper_main(void *arg)
{
    struct reaper *r = arg;
    (void)pthread_setname_np(pthread_self(), "ig-reaper"); /* ps -L, top -H, perf */
    struct db *db = store_db_open(r->cfg->database_url);
    if (!db)
        return NULL;
    int migrated = 0;
    double last_probe = 0, last_sweep = 0;
    while (!atomic_load(&r->stop)) {
        int n = 0;
        /* A replica started while PostgreSQL was down applies the migrations once it is up. */
        if (!migrated) { /* (a changed migration is not tried again: logged once, unready) */
            int m = migrate_run(db);
            migrated = m == STORE_OK || m == STORE_ECONFLICT;
        }
        /* A full batch means more may be waiting: go again at once. */
        while (!atomic_load(&r->stop) && store_reap(db, REAP_BATCH, &n) == STORE_OK &&
               n == REAP_BATCH)
            ;
        if (r->cfg->janitor_interval_ms &&
            (clock_mono() - last_sweep) * 1000 >= r->cfg->janitor_interval_ms) {
            last_sweep = clock_mono();
            sweep(db, r->cfg->janitor_batch);
        }
        if (clock_mono() - last_probe >= PROBE_INTERVAL_S) {
            struct probe_ctx x = {r->cfg, db};
            last_probe = clock_mono();
            if (store_breaker_list(db, probe_one, &x) < 0)
                last_probe = 0; /* try again on the next tick */
        }
        /* Sleep in short steps so that stopping is prompt. */
        for (int slept = 0; slept < r->cfg->reaper_interval_ms && !atomic_load(&r->stop);
             slept += 50)
            clock_sleep_ms(50);
    }
    store_db_close(db);
    return NULL;
}

struct reaper *reaper_start(const struct cfg *cfg)
{
    if (cfg->reaper_interval_ms == 0)
        return NULL;
    struct reaper *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->cfg = cfg;
    if (pthread_create(&r->thread, NULL, reaper_main, r) != 0) {
        LOG(LOG_ERROR, "reaper_start_failed", LS("error", "pthread_create"));
        free(r);
        return NULL;
    }
    return r;
}

void reaper_stop(struct reaper *r)
{
    if (!r)
        return;
    atomic_store(&r->stop, 1);
    pthread_join(r->thread, NULL);
    free(r);
}
