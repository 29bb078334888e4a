#include "idemgate/reaper.h"

#include "idemgate/log.h"
#include "idemgate/migrate.h"
#include "idemgate/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define REAP_BATCH 100

struct reaper {
    const struct cfg *cfg;
    atomic_int stop;
    pthread_t thread;
};

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *reaper_main(void *arg)
{
    struct reaper *r = arg;
    struct db *db = store_db_open(r->cfg->database_url);
    if (!db)
        return NULL;
    int migrated = 0;
    while (!atomic_load(&r->stop)) {
        int n = 0;
        /* A replica started while PostgreSQL was down applies the migrations once it is up. */
        if (!migrated)
            migrated = migrate_run(db) == STORE_OK;
        /* A full batch means more may be waiting: go again at once. */
        while (!atomic_load(&r->stop) && store_reap(db, REAP_BATCH, &n) == STORE_OK &&
               n == REAP_BATCH)
            ;
        /* Sleep in short steps so that stopping is prompt. */
        for (int slept = 0; slept < r->cfg->reaper_interval_ms && !atomic_load(&r->stop);
             slept += 50)
            sleep_ms(50);
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
