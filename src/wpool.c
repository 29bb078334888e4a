#include "idemgate/wpool.h"

#include "idemgate/clock.h"
#include "idemgate/log.h"
#include "idemgate/wake.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* A claim handed to the pool by whoever made it (a row born claimed, recorder.c). */
struct handoff {
    struct store_claim c;
    double claimed_mono;
    struct handoff *next;
};

struct wpool {
    const struct cfg *cfg;
    struct wpool_spec spec;
    atomic_int stop;
    atomic_int quiesce; /* no more claims; handoffs are given back */
    int stop_fd; /* an eventfd that wakes idle threads when stopping */
    int n;
    pthread_t *threads;
    /* Handoffs (under mu): idle threads, slots promised to claims being committed, and the
     * claims handed over and not yet taken. */
    pthread_mutex_t mu;
    int idle, reserved, pending;
    struct handoff *head, *tail;
    int kick_fd; /* an eventfd that wakes idle threads for a handoff */
};

/* Counts, in *arg, the notifications that came from another replica. */
static void on_notify(const char *payload, int sender_pid, void *arg)
{
    (void)payload;
    if (!wake_is_echo(sender_pid))
        ++*(int *)arg;
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

/* The wait when nothing was due: idle_ms, or less when the pool stops, a claim is handed over,
 * this replica has new work (wake_on_work) or another replica signals the channel. This
 * replica's own signals are not waited for: their wake-ups came in process. The work signal is
 * left for take_work_signal. Returns 1 when the caller should claim (anything but a handoff
 * woke it), 0 when it should only take the handoff: a thread fed by handoffs does not query for
 * due work it was not told of. */
static int idle_wait(struct wpool *p, struct db *db)
{
    /* The kick fd stays readable while a handoff waits (see take_handoff). */
    int fds[4] = {p->stop_fd, p->kick_fd, p->spec.chores ? p->spec.chores_fd : -1,
                  p->spec.wake_on_work ? wake_work_fd() : -1};
    int nfds = 0, claim = 0, work_fd = -1;
    for (int i = 0; i < 4; i++)
        if (fds[i] >= 0)
            fds[nfds++] = fds[i];
    if (p->spec.wake_on_work)
        work_fd = fds[nfds - 1];
    double end = clock_mono() + p->spec.idle_ms / 1000.0;
    for (;;) {
        int left = (int)((end - clock_mono()) * 1000.0), foreign = 0;
        if (left <= 0)
            break;
        if (!p->spec.channel) {
            struct pollfd pfd[4];
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
    if (clock_mono() >= end || atomic_load(&p->stop))
        claim = 1;
    if (work_fd >= 0) { /* signalled: every thread woken claims (it is consumed just before) */
        struct pollfd pfd = {.fd = work_fd, .events = POLLIN};
        if (poll(&pfd, 1, 0) > 0)
            claim = 1;
    }
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

int wpool_reserve(struct wpool *p, int n)
{
    if (!p || n <= 0 || p->spec.room_outside)
        return 0;
    pthread_mutex_lock(&p->mu);
    /* Each thread may hold one claim queued behind the operation it is working on: a born
     * claim waits at most one call, and its lease_guard (attempt.c) refuses to send late. */
    int free_slots = p->idle + p->n - p->reserved - p->pending;
    int k = free_slots < n ? (free_slots > 0 ? free_slots : 0) : n;
    p->reserved += k;
    pthread_mutex_unlock(&p->mu);
    return k;
}

void wpool_unreserve(struct wpool *p, int n)
{
    if (!p || n <= 0 || p->spec.room_outside)
        return;
    pthread_mutex_lock(&p->mu);
    p->reserved -= n;
    pthread_mutex_unlock(&p->mu);
}

int wpool_handoff(struct wpool *p, struct store_claim *c, double claimed_mono)
{
    struct handoff *h = malloc(sizeof(*h));
    if (!h)
        return -1;
    h->c = *c;
    h->claimed_mono = claimed_mono;
    h->next = NULL;
    memset(c, 0, sizeof(*c));
    pthread_mutex_lock(&p->mu);
    if (!p->spec.room_outside)
        p->reserved--;
    p->pending++;
    if (p->tail)
        p->tail->next = h;
    else
        p->head = h;
    p->tail = h;
    pthread_mutex_unlock(&p->mu);
    uint64_t one = 1;
    ssize_t w = write(p->kick_fd, &one, sizeof(one));
    (void)w;
    return 0;
}

static struct handoff *take_handoff(struct wpool *p)
{
    pthread_mutex_lock(&p->mu);
    struct handoff *h = p->head;
    if (h) {
        p->head = h->next;
        if (!p->head)
            p->tail = NULL;
        p->pending--;
        uint64_t one;
        ssize_t r = read(p->kick_fd, &one, sizeof(one)); /* a semaphore: one per handoff */
        (void)r;
    }
    pthread_mutex_unlock(&p->mu);
    return h;
}

/* Works on a claim handed over (or, stopping, gives it back): 1 when there was one. */
static int run_handoff(struct wpool *p, struct db *db)
{
    struct handoff *h = take_handoff(p);
    if (!h)
        return 0;
    int stopping = atomic_load(&p->stop) || atomic_load(&p->quiesce);
    wpool_work_fn fn = stopping && p->spec.give_back ? p->spec.give_back : p->spec.work;
    fn(p->cfg, db, &h->c, h->claimed_mono, p->spec.arg);
    store_claim_fini(&h->c);
    free(h);
    return 1;
}

static void set_idle(struct wpool *p, int delta)
{
    pthread_mutex_lock(&p->mu);
    p->idle += delta;
    pthread_mutex_unlock(&p->mu);
}

static void *wpool_main(void *arg)
{
    struct wpool *p = arg;
    struct db *db = store_db_open(p->cfg->database_url);
    unsigned gen = 0;
    int backoff_ms = 100, claim = 1;
    /* Due work no signal announces (a retry's next_attempt_at) is claimed at least this often. */
    double next_claim = 0;
    if (!db)
        return NULL;
    int claim_turn = 0; /* with handoffs and due work both waiting, take them in turn */
    while (!atomic_load(&p->stop)) {
        /* Results of calls go before anything: they free room and answer waiting clients. */
        if (p->spec.chores && p->spec.chores(db, p->spec.arg))
            continue;
        /* A claim handed over goes first (its lease is already running), but never twice in a
         * row while due work waits: born claims must not starve the fair claim. */
        if (!(claim && claim_turn) && run_handoff(p, db)) {
            claim_turn = 1;
            continue;
        }
        claim_turn = 0;
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
        set_idle(p, 1);
        claim = idle_wait(p, db);
        set_idle(p, -1);
    }
    while (run_handoff(p, db)) /* claims handed over before the stop: given back */
        ;
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
    p->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK | EFD_SEMAPHORE);
    p->threads = calloc((size_t)n + 1, sizeof(pthread_t));
    pthread_mutex_init(&p->mu, NULL);
    if (!p->threads || p->stop_fd < 0 || p->kick_fd < 0) {
        if (p->stop_fd >= 0)
            close(p->stop_fd);
        if (p->kick_fd >= 0)
            close(p->kick_fd);
        pthread_mutex_destroy(&p->mu);
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
    /* Handoffs still queued are given back by the threads their kicks wake. */
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
    /* Without threads (n = 0) nothing was ever reserved, so nothing was handed over. */
    close(p->stop_fd);
    close(p->kick_fd);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}
