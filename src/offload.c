#include "idemgate/offload.h"

#include "idemgate/log.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct fifo {
    struct offload_item *head, *tail;
};

/* A caller's lane: its items, and whose they are while it holds any. */
struct lane {
    struct fifo q;
    size_t klen;
    char key[OFFLOAD_KEY_MAX];
};

struct offload {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct fifo upkeep;
    struct lane lanes[OFFLOAD_LANES];
    int last;   /* the lane an item was last taken from: the turn goes on after it */
    int queued; /* items in the lanes */
    int closed;
    int n;
    pthread_t *threads;
};

int offload_lane(const char *key, size_t len)
{
    static const size_t ulen = sizeof(OFFLOAD_UNTRUSTED_KEY) - 1;
    if (key && len == ulen && memcmp(key, OFFLOAD_UNTRUSTED_KEY, ulen) == 0)
        return 0;
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ULL;
    }
    return 1 + (int)((h ^ (h >> 32)) % (OFFLOAD_LANES - 1));
}

static void fifo_push(struct fifo *f, struct offload_item *it)
{
    it->next = NULL;
    if (f->tail)
        f->tail->next = it;
    else
        f->head = it;
    f->tail = it;
}

static struct offload_item *fifo_pop(struct fifo *f)
{
    struct offload_item *it = f->head;
    if (it) {
        f->head = it->next;
        if (!f->head)
            f->tail = NULL;
    }
    return it;
}

/* The lane of a caller's item (offload.h), with the lock held: lane 0 for the untrusted key;
 * else the lane that holds the caller's items, else the first empty lane from its home lane on
 * (it is the caller's while it holds any), else — every lane held by another caller — its home
 * lane, shared. */
static int lane_of(struct offload *o, const char *key, size_t len)
{
    int home = offload_lane(key, len);
    if (home == 0)
        return 0;
    size_t k = len < OFFLOAD_KEY_MAX ? len : OFFLOAD_KEY_MAX;
    for (int l = 1; l < OFFLOAD_LANES; l++) {
        const struct lane *ln = &o->lanes[l];
        if (ln->q.head && ln->klen == len && memcmp(ln->key, key, k) == 0)
            return l;
    }
    for (int i = 0; i < OFFLOAD_LANES - 1; i++) {
        int l = 1 + (home - 1 + i) % (OFFLOAD_LANES - 1);
        struct lane *ln = &o->lanes[l];
        if (!ln->q.head) {
            ln->klen = len;
            if (k)
                memcpy(ln->key, key, k);
            return l;
        }
    }
    return home;
}

/* The next item: upkeep first, then the next lane after the last one served that holds any.
 * Called with the lock held; NULL when nothing is queued. */
static struct offload_item *take(struct offload *o)
{
    struct offload_item *it = fifo_pop(&o->upkeep);
    if (it || !o->queued)
        return it;
    for (int k = 1; k <= OFFLOAD_LANES; k++) {
        int lane = (o->last + k) % OFFLOAD_LANES;
        if ((it = fifo_pop(&o->lanes[lane].q)) != NULL) {
            o->last = lane;
            o->queued--;
            return it;
        }
    }
    return NULL;
}

static void *offload_main(void *arg)
{
    struct offload *o = arg;
    (void)pthread_setname_np(pthread_self(), "ig-dbworker"); /* ps -L, top -H, perf */
    for (;;) {
        pthread_mutex_lock(&o->mu);
        struct offload_item *it;
        while (!(it = take(o)) && !o->closed)
            pthread_cond_wait(&o->cv, &o->mu);
        pthread_mutex_unlock(&o->mu);
        if (!it)
            return NULL; /* closed and nothing left */
        it->fn(it->arg);
    }
}

struct offload *offload_start(int n)
{
    struct offload *o = calloc(1, sizeof(*o));
    if (!o)
        return NULL;
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    o->last = OFFLOAD_LANES - 1;
    o->threads = calloc((size_t)(n > 0 ? n : 1), sizeof(*o->threads));
    if (!o->threads) {
        offload_free(o);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (pthread_create(&o->threads[i], NULL, offload_main, o) != 0) {
            LOG(LOG_ERROR, "offload_start_failed", LI("thread", i));
            offload_free(o);
            return NULL;
        }
        o->n++;
    }
    return o;
}

/* Queues it: upkeep when key is NULL, else in its caller's lane. */
static int submit(struct offload *o, struct offload_item *it, const char *key, size_t len)
{
    if (!o)
        return -1;
    pthread_mutex_lock(&o->mu);
    if (o->closed || !o->n) {
        pthread_mutex_unlock(&o->mu);
        return -1;
    }
    if (!key) {
        it->lane = -1;
        fifo_push(&o->upkeep, it);
    } else {
        it->lane = lane_of(o, key, len);
        fifo_push(&o->lanes[it->lane].q, it);
        o->queued++;
    }
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return 0;
}

int offload_submit(struct offload *o, struct offload_item *it)
{
    return submit(o, it, NULL, 0);
}

int offload_submit_as(struct offload *o, struct offload_item *it, const char *key, size_t len)
{
    return submit(o, it, key ? key : "", key ? len : 0);
}

void offload_close(struct offload *o)
{
    if (!o)
        return;
    pthread_mutex_lock(&o->mu);
    int was = o->closed;
    o->closed = 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    if (was)
        return;
    for (int i = 0; i < o->n; i++)
        pthread_join(o->threads[i], NULL);
}

void offload_free(struct offload *o)
{
    if (!o)
        return;
    offload_close(o);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    free(o->threads);
    free(o);
}
