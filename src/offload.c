#include "idemgate/offload.h"

#include "idemgate/log.h"

#include <pthread.h>
#include <stdlib.h>

struct offload {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct offload_item *head, *tail;
    int closed;
    int n;
    pthread_t *threads;
};

static void *offload_main(void *arg)
{
    struct offload *o = arg;
    (void)pthread_setname_np(pthread_self(), "ig-dbworker"); /* ps -L, top -H, perf */
    for (;;) {
        pthread_mutex_lock(&o->mu);
        while (!o->head && !o->closed)
            pthread_cond_wait(&o->cv, &o->mu);
        struct offload_item *it = o->head;
        if (it) {
            o->head = it->next;
            if (!o->head)
                o->tail = NULL;
        }
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

int offload_submit(struct offload *o, struct offload_item *it)
{
    if (!o)
        return -1;
    it->next = NULL;
    pthread_mutex_lock(&o->mu);
    if (o->closed || !o->n) {
        pthread_mutex_unlock(&o->mu);
        return -1;
    }
    if (o->tail)
        o->tail->next = it;
    else
        o->head = it;
    o->tail = it;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return 0;
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
