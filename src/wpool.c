#include "idemgate/wpool.h"

#include "idemgate/clock.h"
#include "idemgate/log.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct wpool {
    const struct cfg *cfg;
    struct wpool_spec spec;
    atomic_int stop;
    int stop_fd; /* an eventfd that wakes idle threads when stopping */
    int n;
    pthread_t *threads;
};

static void noop_notify(const char *payload, void *arg)
{
    (void)payload;
    (void)arg;
}

/* Waits ms, or less when the pool is stopping. */
static void wait_or_stop(struct wpool *p, int ms)
{
    struct pollfd pfd = {.fd = p->stop_fd, .events = POLLIN};
    (void)poll(&pfd, 1, ms);
}

/* Keeps the connection LISTENing on the pool's channel (a new connection forgets it). 0 when it
 * is not: the caller goes round again after a growing pause. */
static int keep_listening(struct wpool *p, struct db *db, unsigned *gen, int *backoff_ms)
{
    if (store_db_generation(db) == *gen && store_db_ok(db)) {
        *backoff_ms = 100;
        return 1;
    }
    if (store_listen(db, p->spec.channel) == STORE_OK) {
        *gen = store_db_generation(db);
        *backoff_ms = 100;
        return 1;
    }
    wait_or_stop(p, *backoff_ms);
    *backoff_ms = *backoff_ms < 2000 ? *backoff_ms * 2 : 2000;
    return 0;
}

/* Claims one due operation and works on it: 1 when it did, 0 when nothing was due, or the
 * store's error. */
static int claim_and_run(struct wpool *p, struct db *db)
{
    struct store_claim c;
    double claimed = clock_mono(); /* before the claim: the lease is no older */
    int e = p->spec.claim(db, p->cfg->instance_id, p->cfg->lease_seconds, &c);
    if (e == STORE_ENOTFOUND)
        return 0;
    if (e < 0)
        return e;
    p->spec.work(p->cfg, db, &c, claimed);
    store_claim_fini(&c);
    return 1;
}

static void *wpool_main(void *arg)
{
    struct wpool *p = arg;
    struct db *db = store_db_open(p->cfg->database_url);
    unsigned gen = 0;
    int backoff_ms = 100;
    if (!db)
        return NULL;
    while (!atomic_load(&p->stop)) {
        if (p->spec.channel && !keep_listening(p, db, &gen, &backoff_ms))
            continue;
        int e = claim_and_run(p, db);
        if (e > 0)
            continue; /* there may be more due */
        if (e == 0 && p->spec.channel)
            (void)store_wait_notify(db, p->spec.idle_ms, p->stop_fd, noop_notify, NULL);
        else /* nothing due; or the database refused (or is being migrated): do not spin */
            wait_or_stop(p, e == 0 ? p->spec.idle_ms : p->spec.error_ms);
    }
    store_db_close(db);
    return NULL;
}

struct wpool *wpool_start(const struct cfg *cfg, int n, const struct wpool_spec *spec)
{
    struct wpool *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->cfg = cfg;
    p->spec = *spec;
    p->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    p->threads = calloc((size_t)n + 1, sizeof(pthread_t));
    if (!p->threads || p->stop_fd < 0) {
        if (p->stop_fd >= 0)
            close(p->stop_fd);
        free(p->threads);
        free(p);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (pthread_create(&p->threads[i], NULL, wpool_main, p) != 0) {
            LOG(LOG_ERROR, "wpool_start_failed", LS("pool", spec->name), LI("worker", i));
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
    /* The counter stays non-zero, so every idle thread's poll returns at once. */
    uint64_t one = 1;
    ssize_t w = write(p->stop_fd, &one, sizeof(one));
    (void)w;
    for (int i = 0; i < p->n; i++)
        pthread_join(p->threads[i], NULL);
    close(p->stop_fd);
    free(p->threads);
    free(p);
}
