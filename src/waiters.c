#include "idemgate/waiters.h"

#include "idemgate/crypto.h"
#include "idemgate/log.h"
#include "idemgate/store.h"
#include "idemgate/wake.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The longest either thread sleeps: how late a deadline or a new waiter's first read may be. */
#define TICK_MS 50
/* How often the waiters' clients are checked for having left. */
#define GONE_CHECK_MS 200

struct waiter {
    char job_id[CRYPTO_JOB_ID_LEN];
    double deadline;
    int checked; /* its job's state was read after LISTEN was in place */
    void (*wake)(void *arg);
    void *arg;
};

/* Jobs this process saw become terminal: a waiter registered just after its job finished here
 * finds it without a read (waiters_add_local). Direct-mapped by a hash of the id; an entry lost
 * to a collision costs that waiter at most wait_poll_ms. */
#define RECENT_N 1024

struct waiters {
    const struct cfg *cfg;
    pthread_mutex_t mu;
    struct waiter *v;
    size_t n, cap;
    char recent[RECENT_N][CRYPTO_JOB_ID_LEN]; /* under mu */
    int (*gone)(void *arg); /* whether a waiter's client left (waiters_on_gone) */
    double next_gone_check;
    atomic_int stop; /* closed: no new waiter is taken (set under mu) */
    pthread_t thread, timer;
    int running; /* the threads are to be joined (touched by the starting/stopping thread only) */
};

double waiters_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t recent_slot(const char *job_id)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)job_id; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h % RECENT_N;
}

/* Whether job_id is among the jobs seen finished here; the caller holds the lock. */
static int recent_has(const struct waiters *w, const char *job_id)
{
    return strcmp(w->recent[recent_slot(job_id)], job_id) == 0;
}

static int add(struct waiters *w, const char *job_id, double deadline, void (*wake)(void *),
               void *arg, int local)
{
    if (!w || strlen(job_id) >= CRYPTO_JOB_ID_LEN)
        return -1;
    pthread_mutex_lock(&w->mu);
    if (atomic_load(&w->stop) || (w->n == w->cap && w->cap >= 1u << 20)) {
        pthread_mutex_unlock(&w->mu);
        return -1;
    }
    if (local && recent_has(w, job_id)) {
        pthread_mutex_unlock(&w->mu);
        wake(arg);
        return 0;
    }
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        struct waiter *nv = realloc(w->v, cap * sizeof(*nv));
        if (!nv) {
            pthread_mutex_unlock(&w->mu);
            return -1;
        }
        w->v = nv;
        w->cap = cap;
    }
    struct waiter *e = &w->v[w->n++];
    strcpy(e->job_id, job_id);
    e->deadline = deadline;
    e->checked = local;
    e->wake = wake;
    e->arg = arg;
    pthread_mutex_unlock(&w->mu);
    return 0;
}

int waiters_add(struct waiters *w, const char *job_id, double deadline, void (*wake)(void *),
                void *arg)
{
    return add(w, job_id, deadline, wake, arg, 0);
}

int waiters_add_local(struct waiters *w, const char *job_id, double deadline,
                      void (*wake)(void *), void *arg)
{
    return add(w, job_id, deadline, wake, arg, 1);
}

/* Every waiter's job is to be read again. */
static void mark_unchecked(struct waiters *w)
{
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < w->n; i++)
        w->v[i].checked = 0;
    pthread_mutex_unlock(&w->mu);
}

/* Wakes and removes waiter i; the caller holds the lock. */
static void wake_at(struct waiters *w, size_t i)
{
    struct waiter e = w->v[i];
    w->v[i] = w->v[--w->n];
    e.wake(e.arg);
}

void waiters_job_done(const char *id, void *arg)
{
    struct waiters *w = arg;
    size_t len = strlen(id);
    pthread_mutex_lock(&w->mu);
    if (len && len < CRYPTO_JOB_ID_LEN)
        memcpy(w->recent[recent_slot(id)], id, len + 1);
    for (size_t i = 0; i < w->n;) {
        if (strcmp(w->v[i].job_id, id) == 0)
            wake_at(w, i);
        else
            i++;
    }
    pthread_mutex_unlock(&w->mu);
}

/* A LISTEN payload: the job ids another replica saw become terminal. This replica's own
 * signals are skipped: their waiters were woken in process. */
static void on_done_notify(const char *payload, int sender_pid, void *arg)
{
    if (!wake_is_echo(sender_pid))
        (void)wake_split(payload, waiters_job_done, arg);
}

/* Reads, in one query, the state of every waiter not checked yet and wakes those whose job is
 * terminal. A job may have become terminal between the client's read and the waiter's
 * registration, when no signal could reach it; and a signal may have been lost. */
static void check_unchecked(struct waiters *w, struct db *db)
{
    char(*copy)[CRYPTO_JOB_ID_LEN] = NULL;
    const char **ids = NULL;
    size_t n = 0;
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < w->n; i++)
        n += !w->v[i].checked;
    if (n) {
        copy = malloc(n * sizeof(*copy));
        ids = malloc(n * sizeof(*ids));
    }
    size_t k = 0;
    for (size_t i = 0; copy && ids && i < w->n; i++) {
        if (!w->v[i].checked) {
            strcpy(copy[k], w->v[i].job_id);
            ids[k] = copy[k];
            k++;
            w->v[i].checked = 1;
        }
    }
    pthread_mutex_unlock(&w->mu);
    if (k && store_terminal_ids(db, ids, k, waiters_job_done, w) < 0)
        mark_unchecked(w); /* read them again next round */
    free(copy);
    free(ids);
}

/* Wakes the waiters whose deadline has passed, and, every GONE_CHECK_MS, those whose client
 * left: its connection is then answered (and closed) at once rather than held to the deadline. */
static void wake_expired(struct waiters *w)
{
    double now = waiters_now();
    pthread_mutex_lock(&w->mu); /* w->gone is set under it (waiters_on_gone) */
    int check_gone = w->gone && now >= w->next_gone_check;
    if (check_gone)
        w->next_gone_check = now + GONE_CHECK_MS / 1000.0;
    for (size_t i = 0; i < w->n;) {
        if (w->v[i].deadline <= now || (check_gone && w->gone(w->v[i].arg)))
            wake_at(w, i);
        else
            i++;
    }
    pthread_mutex_unlock(&w->mu);
}

void waiters_on_gone(struct waiters *w, int (*gone)(void *arg))
{
    pthread_mutex_lock(&w->mu);
    w->gone = gone;
    pthread_mutex_unlock(&w->mu);
}

static void *waiters_main(void *arg)
{
    struct waiters *w = arg;
    (void)pthread_setname_np(pthread_self(), "ig-waiters"); /* ps -L, top -H, perf */
    struct db *db = store_db_open(w->cfg->database_url);
    unsigned gen = 0;
    double poll_s = w->cfg->wait_poll_ms / 1000.0, next_poll = waiters_now() + poll_s;
    if (!db)
        return NULL;
    while (!atomic_load(&w->stop)) {
        if (store_db_generation(db) != gen || !store_db_ok(db)) {
            if (store_listen(db, WAKE_DONE_CHANNEL) == STORE_OK) {
                gen = store_db_generation(db);
                /* Signals sent while we were not listening are lost: read them all. */
                mark_unchecked(w);
            }
        }
        if (waiters_now() >= next_poll) {
            mark_unchecked(w); /* the safety net: a lost signal costs at most wait_poll_ms */
            next_poll = waiters_now() + poll_s;
        }
        if (store_db_ok(db))
            check_unchecked(w, db);
        if (!store_db_ok(db) || store_wait_notify(db, TICK_MS, NULL, 0, on_done_notify, w) < 0) {
            struct timespec ts = {0, TICK_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    store_db_close(db);
    return NULL;
}

/* The deadlines and the clients that left, on a thread of their own: the thread above waits on
 * the database (its reads, its LISTEN), and a database that stalls (a statement sent to a silent
 * peer waits up to tcp_user_timeout, a minute) held every wait past its deadline with it. The
 * database may be unreachable from the start, too: deadlines are kept all the same. */
static void *timer_main(void *arg)
{
    struct waiters *w = arg;
    (void)pthread_setname_np(pthread_self(), "ig-wait-timer");
    while (!atomic_load(&w->stop)) {
        struct timespec ts = {0, TICK_MS * 1000000L};
        nanosleep(&ts, NULL);
        wake_expired(w);
    }
    return NULL;
}

struct waiters *waiters_start(const struct cfg *cfg)
{
    struct waiters *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->cfg = cfg;
    pthread_mutex_init(&w->mu, NULL);
    if (pthread_create(&w->thread, NULL, waiters_main, w) != 0) {
        pthread_mutex_destroy(&w->mu);
        free(w);
        return NULL;
    }
    if (pthread_create(&w->timer, NULL, timer_main, w) != 0) {
        atomic_store(&w->stop, 1);
        pthread_join(w->thread, NULL);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return NULL;
    }
    w->running = 1;
    return w;
}

void waiters_close(struct waiters *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    /* Under the lock: a waiters_add that got in before is woken below, any later one refuses. */
    atomic_store(&w->stop, 1);
    while (w->n)
        wake_at(w, 0);
    pthread_mutex_unlock(&w->mu);
    /* Only the shutdown thread closes: nobody else joins. */
    if (w->running) {
        pthread_join(w->thread, NULL);
        pthread_join(w->timer, NULL);
        w->running = 0;
    }
}

void waiters_free(struct waiters *w)
{
    if (!w)
        return;
    waiters_close(w);
    pthread_mutex_destroy(&w->mu);
    free(w->v);
    free(w);
}
