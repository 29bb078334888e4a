#include "idemgate/dispatcher.h"
#include "idemgate/clock.h"

#include "idemgate/attempt.h"
#include "idemgate/crash.h"
#include "idemgate/log.h"
#include "idemgate/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

struct dispatcher {
    const struct cfg *cfg;
    atomic_int stop;
    int stop_fd; /* an eventfd that wakes idle workers when stopping */
    int n;
    pthread_t *threads;
};

static void noop_notify(const char *payload, void *arg)
{
    (void)payload;
    (void)arg;
}

static void *worker_main(void *arg)
{
    struct dispatcher *d = arg;
    const struct cfg *cfg = d->cfg;
    struct db *db = store_db_open(cfg->database_url);
    unsigned listening_gen = 0;
    int backoff_ms = 100;
    if (!db)
        return NULL;
    while (!atomic_load(&d->stop)) {
        if (store_db_generation(db) != listening_gen || !store_db_ok(db)) {
            if (store_listen(db, "idemgate_work") == STORE_OK) {
                listening_gen = store_db_generation(db);
            } else {
                struct timespec ts = {backoff_ms / 1000, (backoff_ms % 1000) * 1000000L};
                nanosleep(&ts, NULL);
                backoff_ms = backoff_ms < 2000 ? backoff_ms * 2 : 2000;
                continue;
            }
        }
        backoff_ms = 100;
        struct store_claim c;
        double claimed = clock_mono(); /* before the claim: the lease is no older */
        int e = store_claim(db, cfg->instance_id, cfg->lease_seconds, &c);
        if (e == STORE_OK) {
            CRASH_POINT("after_sending_commit");
            attempt_create(cfg, db, &c, claimed);
            store_claim_fini(&c);
            continue; /* there may be more due */
        }
        if (e == STORE_ENOTFOUND) {
            (void)store_wait_notify(db, cfg->poll_interval_ms, d->stop_fd, noop_notify, NULL);
        } else {
            /* The database refused (or is being migrated): do not spin on it. */
            struct timespec ts = {0, 200 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    store_db_close(db);
    return NULL;
}

struct dispatcher *disp_start(const struct cfg *cfg)
{
    struct dispatcher *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->cfg = cfg;
    d->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    d->threads = calloc((size_t)cfg->dispatch_workers + 1, sizeof(pthread_t));
    if (!d->threads || d->stop_fd < 0) {
        if (d->stop_fd >= 0)
            close(d->stop_fd);
        free(d->threads);
        free(d);
        return NULL;
    }
    for (int i = 0; i < cfg->dispatch_workers; i++) {
        if (pthread_create(&d->threads[i], NULL, worker_main, d) != 0) {
            LOG(LOG_ERROR, "dispatch_start_failed", LI("worker", i));
            disp_stop(d);
            return NULL;
        }
        d->n++;
    }
    return d;
}

void disp_stop(struct dispatcher *d)
{
    if (!d)
        return;
    atomic_store(&d->stop, 1);
    /* The counter stays non-zero, so every idle worker's poll returns at once. */
    uint64_t one = 1;
    ssize_t w = write(d->stop_fd, &one, sizeof(one));
    (void)w;
    for (int i = 0; i < d->n; i++)
        pthread_join(d->threads[i], NULL);
    close(d->stop_fd);
    free(d->threads);
    free(d);
}
