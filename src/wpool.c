#include "idemgate/wpool.h"

#include "idemgate/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

struct wpool {
    const struct cfg *cfg;
    wpool_step_fn step;
    int idle_ms;
    atomic_int stop;
    int n;
    pthread_t *threads;
};

static void *wpool_main(void *arg)
{
    struct wpool *p = arg;
    struct db *db = store_db_open(p->cfg->database_url);
    if (!db)
        return NULL;
    while (!atomic_load(&p->stop)) {
        if (p->step(p->cfg, db) > 0)
            continue;
        for (int slept = 0; slept < p->idle_ms && !atomic_load(&p->stop); slept += 20) {
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    store_db_close(db);
    return NULL;
}

struct wpool *wpool_start(const struct cfg *cfg, int n, wpool_step_fn step, int idle_ms)
{
    struct wpool *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->cfg = cfg;
    p->step = step;
    p->idle_ms = idle_ms;
    p->threads = calloc((size_t)n + 1, sizeof(pthread_t));
    if (!p->threads) {
        free(p);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (pthread_create(&p->threads[i], NULL, wpool_main, p) != 0) {
            wpool_stop(p);
            return NULL;
        }
        p->n++;
    }
    return p;
}

void wpool_stop(struct wpool *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    for (int i = 0; i < p->n; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p);
}
