#include "idemgate/wpool.h"

#include "idemgate/clock.h"
#include "idemgate/log.h"
#include "idemgate/wake.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct wpool {
    const struct cfg *cfg;
    struct wpool_spec spec;
    atomic_int stop;
    atomic_int quiesce; /* no more claims; only chores */
    atomic_int chores_waiter; /* an idle thread waits on chores_fd (at most one at a time) */
    int stop_fd; /* an eventfd that wakes idle threads when stopping */
    int n;
    pthread_t *threads;
};

/* Counts, in *arg, the notifications that came from another replica. */
static void on_notify(const char *payload, int sender_pid, void *arg)
{
    (void)payload;
    if (!wake_is_echo(sender_pid)) {
        wake_heard_work();
        ++*(int *)arg;
    }
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

/* The wait when nothing was due: idle_ms, or less when the pool stops, chores arrive, this
 * replica has new work (wake_on_work) or another replica signals the channel. This replica's own
 * signals are not waited for: their wake-ups came in process. The work signal is left for
 * take_work_signal. Returns 1 when the caller should claim, 0 when it should only do its chores:
 * a thread woken for results does not query for due work it was not told of. */
static int idle_wait(struct wpool *p, struct db *db)
{
    /* Once quiesced no claim consumes the work signal (take_work_signal): waiting on it would
     * return at once, every thread spinning until the stop, after the first job given back or
     * backed off during the drain. */
    int work_fd = p->spec.wake_on_work && !atomic_load(&p->quiesce) ? wake_work_fd() : -1;
    /* One idle thread at a time waits for chores. Every thread waiting on one eventfd would wake
     * at each ended call, race for the queue and mostly find it taken: a context switch each,
     * and smaller batches (a round trip and a commit each). The others do the chores they find
     * when they come round for any other reason, so none waits on a waiter that is busy longer
     * than its own work or idle_ms. */
    int waiter = p->spec.chores && atomic_exchange(&p->chores_waiter, 1) == 0;
    int fds[3] = {p->stop_fd, waiter ? p->spec.chores_fd : -1, work_fd};
    int nfds = 0, claim = 0;
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0)
            fds[nfds++] = fds[i];
    /* Chores declined while another thread does them are looked at again when they are due
     * (gcommit.h), though nothing new arrives: a shorter wait for the chores' waiter (the others
     * take chores when they come round), which is no idle turn (no claim). */
    int wait_ms = p->spec.idle_ms, shortened = 0;
    int due = waiter && p->spec.chores_due_ms ? p->spec.chores_due_ms(p->spec.arg) : -1;
    if (due >= 0 && due < wait_ms) {
        wait_ms = due > 0 ? due : 1;
        shortened = 1;
    }
    double end = clock_mono() + wait_ms / 1000.0;
    for (;;) {
        /* Rounded up: a wait of a fraction of a millisecond is one, not none (no spin). */
        int left = (int)((end - clock_mono()) * 1000.0 + 0.999), foreign = 0;
        if (left <= 0)
            break;
        if (!p->spec.channel) {
            struct pollfd pfd[3];
            for (int i = 0; i < nfds; i++)
                pfd[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
            (void)poll(pfd, (nfds_t)nfds, left);
            break;
        }
        int got = store_wait_notify(db, left, fds, nfds, on_notify, &foreign);
        if (got < 0 || foreign) {
            claim = 1;
            break;
        }
        if (got == 0)
            break;
    }
    if ((clock_mono() >= end && !shortened) || atomic_load(&p->stop))
        claim = 1;
    if (work_fd >= 0) { /* signalled: every thread woken claims (it is consumed just before) */
        struct pollfd pfd = {.fd = work_fd, .events = POLLIN};
        if (poll(&pfd, 1, 0) > 0)
            claim = 1;
    }
    if (waiter)
        atomic_store(&p->chores_waiter, 0);
    if (p->spec.chores && (!p->spec.starved || p->spec.starved(p->spec.arg))) {
        /* A call ended: results to write, and room for the claim that found none. */
        struct pollfd pfd = {.fd = p->spec.chores_fd, .events = POLLIN};
        if (poll(&pfd, 1, 0) > 0)
            claim = 1;
    }
    return claim;
}

/* Consumes this replica's work signal before a claim, so that one given after the claim is never
 * missed. */
static void take_work_signal(struct wpool *p)
{
    int fd = p->spec.wake_on_work ? wake_work_fd() : -1;
    if (fd >= 0) {
        uint64_t v;
        ssize_t r = read(fd, &v, sizeof(v)); /* EAGAIN: another thread took it, or none */
        (void)r;
    }
}

/* Claims one due operation and works on it: 1 when it did, 0 when nothing was due, or the
 * store's error. */
static int claim_and_run(struct wpool *p, struct db *db)
{
    struct store_claim c;
    double claimed = clock_mono(); /* before the claim: the lease is no older */
    int e = p->spec.claim_arg
                ? p->spec.claim_arg(db, p->cfg->instance_id, p->cfg->lease_seconds, &c, p->spec.arg)
                : p->spec.claim(db, p->cfg->instance_id, p->cfg->lease_seconds, &c);
    if (e == STORE_ENOTFOUND)
        return 0;
    if (e < 0)
        return e;
    p->spec.work(p->cfg, db, &c, claimed, p->spec.arg);
    store_claim_fini(&c);
    return 1;
}

static void *wpool_main(void *arg)
{
    struct wpool *p = arg;
    char name[16];
    snprintf(name, sizeof(name), "ig-%s", p->spec.name);
    (void)pthread_setname_np(pthread_self(), name); /* ps -L, top -H, perf */
    struct db *db = store_db_open(p->cfg->database_url);
    unsigned gen = 0;
    int backoff_ms = 100, claim = 1;
    /* Due work no signal announces (a retry's next_attempt_at) is claimed at least this often. */
    double next_claim = 0;
    if (!db)
        return NULL;
    while (!atomic_load(&p->stop)) {
        /* Chores go first (born reservations to start, results to write): their leases run,
         * they free room and they answer waiting clients. A claim is made between two batches. */
        int busy = p->spec.chores && p->spec.chores(db, p->spec.arg);
        if (busy && !claim && clock_mono() < next_claim)
            continue;
        if (p->spec.channel && !keep_listening(p, db, &gen, &backoff_ms))
            continue;
        if (!atomic_load(&p->quiesce) && (claim || clock_mono() >= next_claim)) {
            take_work_signal(p);
            int e = claim_and_run(p, db);
            if (e > 0) {
                claim = 1; /* there may be more due */
                continue;
            }
            if (e < 0) { /* the database refused (or is being migrated): do not spin */
                wait_or_stop(p, p->spec.error_ms);
                continue;
            }
            claim = 0;
            next_claim = clock_mono() + p->spec.idle_ms / 1000.0;
        }
        if (!busy)
            claim = idle_wait(p, db);
    }
    while (p->spec.chores && p->spec.chores(db, p->spec.arg)) /* results still to write */
        ;
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

void wpool_quiesce(struct wpool *p)
{
    if (!p)
        return;
    atomic_store(&p->quiesce, 1);
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
