#include "idemgate/wake.h"

#include "idemgate/clock.h"
#include "idemgate/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* The pause after the database refused a signal, doubled up to the maximum. */
#define RETRY_MIN_MS 100
#define RETRY_MAX_MS 2000

/* What the other replicas have not been told yet. */
struct wake_queue {
    char (*ids)[WAKE_ID_MAX + 1];
    size_t n, cap;
    int work;       /* some operation became prepared */
    size_t dropped; /* ids not kept: the queue was full */
};

/* The process's one wake module (see wake.h). */
static struct {
    pthread_mutex_t mu; /* q, stop */
    pthread_cond_t cv;  /* the queue became non-empty, or stop */
    struct wake_queue q;
    int stop;
    int running; /* the signaller is to be joined (touched by start and stop only) */
    pthread_t thread;
    atomic_int work_fd;  /* eventfd for the dispatchers, or -1 */
    atomic_int echo_pid; /* the server process of the signaller's connection, or 0 */
    pthread_rwlock_t hook_mu;
    void (*done_fn)(const char *job_id, void *arg);
    void *done_arg;
} W = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cv = PTHREAD_COND_INITIALIZER,
    .hook_mu = PTHREAD_RWLOCK_INITIALIZER,
    .work_fd = -1,
};

/* One transaction: a NOTIFY on the work channel when $1, and one on the done channel per
 * element of $2. */
static const struct db_stmt wake_notify = {
    .name = "wake_notify",
    .sql = "SELECT count(pg_notify(n.channel, n.payload)) FROM ("
           " SELECT '" WAKE_WORK_CHANNEL "' AS channel, '' AS payload WHERE $1::boolean "
           " UNION ALL SELECT '" WAKE_DONE_CHANNEL "', unnest($2::text[])) n",
    .params = DB_PARAMS("work", "done"),
};

/* 1 when s[0..len) can be a job id: it then needs no quoting in a text[] literal and holds no
 * comma. */
static int is_job_id(const char *s, size_t len)
{
    if (len == 0 || len > WAKE_ID_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

char *wake_payloads(const char *const *ids, size_t n, size_t max_payload, size_t *elements)
{
    *elements = 0;
    if (max_payload < WAKE_ID_MAX)
        return NULL;
    /* Worst case, every id its own element: `,"id"`. */
    char *out = malloc(3 + n * (WAKE_ID_MAX + 3));
    if (!out)
        return NULL;
    size_t pos = 0, cur = 0;
    int open = 0;
    out[pos++] = '{';
    for (size_t i = 0; i < n; i++) {
        size_t len = strnlen(ids[i], WAKE_ID_MAX + 1);
        if (!is_job_id(ids[i], len))
            continue;
        if (open && cur + 1 + len > max_payload) {
            out[pos++] = '"';
            open = 0;
        }
        if (!open) {
            if (*elements)
                out[pos++] = ',';
            out[pos++] = '"';
            open = 1;
            cur = 0;
            (*elements)++;
        } else {
            out[pos++] = ',';
            cur++;
        }
        memcpy(out + pos, ids[i], len);
        pos += len;
        cur += len;
    }
    if (open)
        out[pos++] = '"';
    out[pos++] = '}';
    out[pos] = '\0';
    return out;
}

size_t wake_split(const char *payload, void (*cb)(const char *, void *), void *arg)
{
    size_t count = 0;
    for (const char *p = payload; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (is_job_id(p, len)) {
            char id[WAKE_ID_MAX + 1];
            memcpy(id, p, len);
            id[len] = '\0';
            cb(id, arg);
            count++;
        }
        p += len + (comma != NULL);
    }
    return count;
}

static int queue_pending(const struct wake_queue *q)
{
    return q->work || q->n > 0;
}

/* Appends one id; the caller holds W.mu (or owns q). */
static void queue_push(struct wake_queue *q, const char *id, size_t len)
{
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 64;
        void *nv = q->cap < WAKE_QUEUE_MAX ? realloc(q->ids, cap * sizeof(*q->ids)) : NULL;
        if (!nv) {
            q->dropped++;
            return;
        }
        q->ids = nv;
        q->cap = cap;
    }
    memcpy(q->ids[q->n], id, len);
    q->ids[q->n][len] = '\0';
    q->n++;
}

/* Takes everything pending out of the shared queue. */
static struct wake_queue queue_take(void)
{
    pthread_mutex_lock(&W.mu);
    struct wake_queue q = W.q;
    W.q = (struct wake_queue){0};
    pthread_mutex_unlock(&W.mu);
    return q;
}

/* Puts back a batch that could not be sent, ahead of what arrived meanwhile; frees q. */
static void queue_put_back(struct wake_queue *q)
{
    pthread_mutex_lock(&W.mu);
    for (size_t i = 0; i < W.q.n; i++)
        queue_push(q, W.q.ids[i], strlen(W.q.ids[i]));
    q->work |= W.q.work;
    q->dropped += W.q.dropped;
    free(W.q.ids);
    W.q = *q;
    pthread_mutex_unlock(&W.mu);
    *q = (struct wake_queue){0};
}

/* Sends batch q in one transaction on db. 0 or a store error. */
static int send_batch(struct db *db, const struct wake_queue *q)
{
    const char **ptrs = malloc((q->n ? q->n : 1) * sizeof(*ptrs));
    size_t elements = 0;
    char *arr = NULL;
    int e = STORE_EINTERNAL;
    long long sent = 0;
    if (!ptrs)
        goto done;
    for (size_t i = 0; i < q->n; i++)
        ptrs[i] = q->ids[i];
    if (!(arr = wake_payloads(ptrs, q->n, WAKE_PAYLOAD_MAX, &elements)))
        goto done;
    e = db_run_number(db, &wake_notify, DB_ARGS(p_bool("work", q->work), p_text("done", arr)),
                      DB_VALUE, &sent);
done:
    free(arr);
    free(ptrs);
    return e;
}

int wake_flush(struct db *db)
{
    struct wake_queue q = queue_take();
    if (q.dropped)
        LOG(LOG_WARN, "wake_signals_dropped", LI("job_ids", q.dropped),
            LS("note", "their waiters in other replicas fall back on wait_poll_ms"));
    q.dropped = 0;
    if (!queue_pending(&q))
        return STORE_OK;
    int e = send_batch(db, &q);
    if (e < 0) {
        queue_put_back(&q);
        return e;
    }
    free(q.ids);
    return STORE_OK;
}

static atomic_ulong news;

unsigned long wake_news(void)
{
    return atomic_load(&news);
}

void wake_heard_work(void)
{
    atomic_fetch_add(&news, 1);
}

void wake_work(void)
{
    atomic_fetch_add(&news, 1);
    int fd = atomic_load(&W.work_fd);
    if (fd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(fd, &one, sizeof(one)); /* a full counter is still readable */
        (void)w;
    }
    pthread_mutex_lock(&W.mu);
    if (!queue_pending(&W.q))
        pthread_cond_signal(&W.cv);
    W.q.work = 1;
    pthread_mutex_unlock(&W.mu);
}

void wake_done(const char *job_id)
{
    if (!job_id)
        return;
    pthread_rwlock_rdlock(&W.hook_mu);
    if (W.done_fn)
        W.done_fn(job_id, W.done_arg);
    pthread_rwlock_unlock(&W.hook_mu);
    size_t len = strnlen(job_id, WAKE_ID_MAX + 1);
    if (!is_job_id(job_id, len))
        return;
    pthread_mutex_lock(&W.mu);
    if (!queue_pending(&W.q))
        pthread_cond_signal(&W.cv);
    queue_push(&W.q, job_id, len);
    pthread_mutex_unlock(&W.mu);
}

void wake_state(const char *job_id, enum op_state st)
{
    if (st == ST_PREPARED)
        wake_work();
    else if (st_is_terminal(st))
        wake_done(job_id);
}

int wake_work_fd(void)
{
    return atomic_load(&W.work_fd);
}

void wake_on_done(void (*fn)(const char *, void *), void *arg)
{
    pthread_rwlock_wrlock(&W.hook_mu);
    W.done_fn = fn;
    W.done_arg = arg;
    pthread_rwlock_unlock(&W.hook_mu);
}

int wake_is_echo(int sender_pid)
{
    int own = atomic_load(&W.echo_pid);
    return own != 0 && sender_pid == own;
}

/* Waits on W.cv for up to ms, or until stop; the caller holds W.mu. */
static void wait_locked(long ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (!W.stop && pthread_cond_timedwait(&W.cv, &W.mu, &ts) != ETIMEDOUT) {
    }
}

/* One batch on the signaller's connection; listeners recognise its server process as ours.
 * With nothing pending the database is not even reached. */
static int signal_once(struct db *db)
{
    pthread_mutex_lock(&W.mu);
    int pending = queue_pending(&W.q);
    pthread_mutex_unlock(&W.mu);
    if (!pending)
        return STORE_OK;
    if (store_db_ensure(db) == STORE_OK)
        atomic_store(&W.echo_pid, store_db_backend_pid(db));
    return wake_flush(db);
}

/* The signaller: sends at once what arrives after a quiet spell, then at most every
 * WAKE_BATCH_MS; after a refusal, keeps the batch and tries again after a growing pause. */
static void *signaller_main(void *arg)
{
    struct db *db = arg;
    (void)pthread_setname_np(pthread_self(), "ig-signaller"); /* ps -L, top -H, perf */
    double next_at = 0;
    long retry_ms = RETRY_MIN_MS;
    pthread_mutex_lock(&W.mu);
    while (!W.stop) {
        if (!queue_pending(&W.q)) {
            pthread_cond_wait(&W.cv, &W.mu);
            continue;
        }
        long ms = (long)((next_at - clock_mono()) * 1000.0);
        if (ms > 0) {
            wait_locked(ms);
            continue;
        }
        pthread_mutex_unlock(&W.mu);
        int e = signal_once(db);
        next_at = clock_mono() + (e < 0 ? retry_ms : WAKE_BATCH_MS) / 1000.0;
        retry_ms =
            e < 0 ? (retry_ms * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : retry_ms * 2) : RETRY_MIN_MS;
        pthread_mutex_lock(&W.mu);
    }
    pthread_mutex_unlock(&W.mu);
    (void)signal_once(db); /* what the last workers wrote before they stopped */
    store_db_close(db);
    return NULL;
}

int wake_start(const struct cfg *cfg)
{
    pthread_condattr_t ca;
    struct db *db = NULL;
    const char *failed = "eventfd";
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0)
        goto failed;
    /* No thread waits on the condition yet: it can be made anew on the monotonic clock. */
    failed = "condition";
    if (pthread_condattr_init(&ca) != 0)
        goto failed;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_destroy(&W.cv);
    int ce = pthread_cond_init(&W.cv, &ca);
    pthread_condattr_destroy(&ca);
    if (ce != 0)
        goto failed;
    failed = "connection";
    if (!(db = store_db_open(cfg->database_url)))
        goto failed;
    W.stop = 0;
    failed = "thread";
    if (pthread_create(&W.thread, NULL, signaller_main, db) != 0)
        goto failed;
    W.running = 1;
    atomic_store(&W.work_fd, fd);
    return 0;
failed:
    LOG(LOG_ERROR, "wake_start_failed", LS("step", failed));
    store_db_close(db);
    if (fd >= 0)
        close(fd);
    return -1;
}

void wake_stop(void)
{
    if (!W.running)
        return;
    pthread_mutex_lock(&W.mu);
    W.stop = 1;
    pthread_cond_broadcast(&W.cv);
    pthread_mutex_unlock(&W.mu);
    pthread_join(W.thread, NULL);
    W.running = 0;
    int fd = atomic_exchange(&W.work_fd, -1);
    if (fd >= 0)
        close(fd);
    atomic_store(&W.echo_pid, 0);
    pthread_mutex_lock(&W.mu);
    free(W.q.ids);
    W.q = (struct wake_queue){0};
    W.stop = 0;
    pthread_mutex_unlock(&W.mu);
}
