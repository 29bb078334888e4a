#include "idemgate/recorder.h"

#include "idemgate/livestream.h"

#include "idemgate/clock.h"
#include "idemgate/crash.h"
#include "idemgate/dispatcher.h"
#include "idemgate/gcommit.h"
#include "idemgate/lease.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/wake.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Bodies one batch carries at most (a single larger intent still goes, alone). */
#define BATCH_MAX_BYTES (8u << 20)

struct writer;

struct recorder {
    const struct cfg *cfg;
    struct dispatcher *disp; /* takes rows born claimed while it has room; may be NULL */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct rec_item *head, *tail; /* the queue, oldest first */
    size_t queued;                /* items in it */
    int writing;                  /* writers recording a batch now (gcommit.h) */
    int sleepers;                 /* writers waiting without a deadline (nobody was writing) */
    int closed;                   /* under mu */
    struct writer *writers;
    int n_writers; /* started, and not yet joined */
};

/* Orders intents by (tenant, key): the lock order of every batch (no deadlock between writers). */
static int recorder_item_cmp(const void *a, const void *b)
{
    const struct rec_item *x = *(struct rec_item *const *)a, *y = *(struct rec_item *const *)b;
    if (x->in.q.tenant_id != y->in.q.tenant_id)
        return x->in.q.tenant_id < y->in.q.tenant_id ? -1 : 1;
    return strcmp(x->in.q.idempotency_key, y->in.q.idempotency_key);
}

/* Takes the next batch off the queue (under mu): up to max items and BATCH_MAX_BYTES of bodies,
 * at least one. Returns how many. */
static size_t take_batch(struct recorder *rec, struct rec_item **v, size_t max)
{
    size_t n = 0, bytes = 0;
    while (rec->head && n < max &&
           (n == 0 || bytes + rec->head->in.q.body_len <= BATCH_MAX_BYTES)) {
        struct rec_item *it = rec->head;
        rec->head = it->next;
        it->next = NULL;
        bytes += it->in.q.body_len;
        v[n++] = it;
    }
    rec->queued -= n;
    if (!rec->head)
        rec->tail = NULL;
    return n;
}

/* One commit before send: each new row whose call has room in the dispatcher (a slot of the
 * call engine, reserved here) is recorded born claimed by this replica. Returns how many. */
static int offer_claims(struct recorder *rec, struct rec_item **v, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        int born = disp_reserve(rec->disp, v[i]->in.q.provider);
        v[i]->handed_over = 0;
        v[i]->in.q.claim_owner = born ? rec->cfg->instance_id : NULL;
        v[i]->in.q.lease_seconds = rec->cfg->lease_seconds;
        k += born;
    }
    return k;
}

/* After the commit: each row born reserved goes to a dispatcher thread; the slots of rows not
 * recorded born are given back; new `prepared` rows for any replica wake the dispatchers
 * (wake.h). A reservation that cannot be handed over (out of memory) stays `prepared`: any
 * replica sends it once its reservation ends. Returns how many were handed over. */
static int hand_over(struct recorder *rec, struct rec_item **v, size_t n, double claimed_mono)
{
    int used = 0, prepared = 0;
    for (size_t i = 0; i < n; i++) {
        struct store_intake_item *it = &v[i]->in;
        int asked = it->q.claim_owner != NULL;
        int born = it->err == STORE_OK && it->created && lease_is_born(&it->q, &it->job);
        prepared += it->err == STORE_OK && it->created && it->job.state == ST_PREPARED && !born;
        if (!born) {
            if (asked)
                disp_unreserve(rec->disp, it->q.provider);
            continue;
        }
        struct store_claim c;
        if (lease_claim_born(&it->q, &it->job, &c) < 0 ||
            disp_handoff(rec->disp, &c, claimed_mono) < 0) {
            LOG(LOG_WARN, "handoff_failed", LS("job_id", it->job.id),
                LS("note", "still prepared: sent by any replica when its reservation ends"));
            ls_close_unfed(it->job.id); /* nothing streams here: its clients wait for the job */
            store_claim_fini(&c);
            disp_unreserve(rec->disp, it->q.provider);
            continue;
        }
        v[i]->handed_over = 1;
        used++;
    }
    if (prepared)
        wake_work();
    return used;
}

static void record_batch(struct recorder *rec, struct db *db, struct rec_item **v, size_t n,
                         struct store_intake_item **items)
{
    qsort(v, n, sizeof(*v), recorder_item_cmp);
    for (size_t i = 0; i < n; i++)
        items[i] = &v[i]->in;
    (void)offer_claims(rec, v, n);
    double claimed_mono = clock_mono(); /* before the commit: the lease is no older */
    CRASH_POINT("before_intent_commit");
    int e = store_intake_batch(db, items, n);
    int born = hand_over(rec, v, n, claimed_mono);
    metrics_intake_batch(n, e == STORE_OK, born);
    for (size_t i = 0; i < n; i++)
        v[i]->done(v[i]);
}

/* One writer: its connection and its batch buffers. */
struct writer {
    struct recorder *rec;
    pthread_t thread;
    struct db *db;
    struct rec_item **v;
    struct store_intake_item **items;
};

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    (void)pthread_setname_np(pthread_self(), "ig-recorder"); /* ps -L, top -H, perf */
    struct recorder *rec = w->rec;
    size_t max = (size_t)rec->cfg->intake_batch_max;
    pthread_mutex_lock(&rec->mu);
    for (;;) {
        /* Group commit (gcommit.h): while another writer records, what arrives waits for its
         * next commit unless a whole batch waits or the oldest has waited GC_STALL_MS: a writer
         * waiting beside a busy one looks again that often. Closing, everything goes. */
        while (!rec->closed) {
            double age_ms = rec->head ? (clock_mono() - rec->head->queued_mono) * 1000.0 : 0;
            if (gc_take(rec->writing, rec->queued, max, age_ms))
                break;
            if (!rec->writing) {
                rec->sleepers++;
                pthread_cond_wait(&rec->cv, &rec->mu);
                rec->sleepers--;
                continue;
            }
            /* Until the oldest is due, or a whole stall's time when none waits yet. */
            double wait_ms = rec->head ? GC_STALL_MS - age_ms + 1.0 : GC_STALL_MS;
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            long long ns = until.tv_nsec + (long long)(wait_ms * 1e6);
            until.tv_sec += (time_t)(ns / 1000000000LL);
            until.tv_nsec = (long)(ns % 1000000000LL);
            pthread_cond_timedwait(&rec->cv, &rec->mu, &until);
        }
        size_t n = take_batch(rec, w->v, max);
        if (!n)
            break; /* closed, and nothing left to record */
        rec->writing++;
        pthread_mutex_unlock(&rec->mu);
        record_batch(rec, w->db, w->v, n, w->items);
        pthread_mutex_lock(&rec->mu);
        rec->writing--; /* what waited meanwhile is this writer's next batch */
    }
    pthread_mutex_unlock(&rec->mu);
    return NULL;
}

static void writer_fini(struct writer *w)
{
    store_db_close(w->db);
    free(w->v);
    free(w->items);
}

static int writer_init(struct writer *w, struct recorder *rec)
{
    size_t max = (size_t)rec->cfg->intake_batch_max;
    w->rec = rec;
    w->v = calloc(max, sizeof(*w->v));
    w->items = calloc(max, sizeof(*w->items));
    w->db = store_db_open(rec->cfg->database_url);
    if (w->v && w->items && w->db)
        return 0;
    writer_fini(w);
    return -1;
}

struct recorder *recorder_start(const struct cfg *cfg, struct dispatcher *disp)
{
    struct recorder *rec = calloc(1, sizeof(*rec));
    if (!rec)
        return NULL;
    rec->cfg = cfg;
    rec->disp = disp;
    pthread_mutex_init(&rec->mu, NULL);
    pthread_condattr_t ca; /* the writers' timed waits count on the monotonic clock */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&rec->cv, &ca);
    pthread_condattr_destroy(&ca);
    rec->writers = calloc((size_t)cfg->intake_writers, sizeof(*rec->writers));
    if (!rec->writers) {
        recorder_free(rec);
        return NULL;
    }
    for (int i = 0; i < cfg->intake_writers; i++) {
        struct writer *w = &rec->writers[i];
        if (writer_init(w, rec) < 0) {
            recorder_free(rec);
            return NULL;
        }
        if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
            LOG(LOG_ERROR, "recorder_start_failed", LI("writer", i));
            writer_fini(w);
            recorder_free(rec);
            return NULL;
        }
        rec->n_writers++;
    }
    return rec;
}

int recorder_submit(struct recorder *rec, struct rec_item *it)
{
    if (!rec)
        return -1;
    it->next = NULL;
    pthread_mutex_lock(&rec->mu);
    if (rec->closed || !rec->n_writers) {
        pthread_mutex_unlock(&rec->mu);
        return -1;
    }
    it->queued_mono = clock_mono();
    if (rec->tail)
        rec->tail->next = it;
    else
        rec->head = it;
    rec->tail = it;
    rec->queued++;
    /* Behind a busy writer nobody is woken for it (no wake-up per intent): the busy writer
     * takes it next, or a waiting one when it looks again — a writer asleep since nobody wrote
     * is woken once, to look every GC_STALL_MS while one writes. */
    if (gc_take(rec->writing, rec->queued, (size_t)rec->cfg->intake_batch_max, 0) ||
        (rec->writing && rec->sleepers))
        pthread_cond_signal(&rec->cv);
    pthread_mutex_unlock(&rec->mu);
    return 0;
}

void recorder_close(struct recorder *rec)
{
    if (!rec)
        return;
    pthread_mutex_lock(&rec->mu);
    int was = rec->closed;
    rec->closed = 1;
    pthread_cond_broadcast(&rec->cv);
    pthread_mutex_unlock(&rec->mu);
    if (was)
        return;
    for (int i = 0; i < rec->n_writers; i++) {
        pthread_join(rec->writers[i].thread, NULL);
        writer_fini(&rec->writers[i]);
    }
    rec->n_writers = 0;
}

void recorder_free(struct recorder *rec)
{
    if (!rec)
        return;
    recorder_close(rec);
    pthread_cond_destroy(&rec->cv);
    pthread_mutex_destroy(&rec->mu);
    free(rec->writers);
    free(rec);
}
