#include "idemgate/resultq.h"

#include "idemgate/clock.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct rq {
    pthread_mutex_t mu;
    struct rq_item *head, *tail;
    size_t n; /* items waiting */
    int fd;
    /* 1 from the write that made fd readable until rq_drain_fd: a signal while it is 1 would add
     * nothing the consumer does not already see, and costs a system call (a dispatcher's queue is
     * pushed once per ended call). The consumer clears it after reading fd and before taking. */
    atomic_int armed;
};

struct rq *rq_new(void)
{
    struct rq *q = calloc(1, sizeof(*q));
    if (!q)
        return NULL;
    q->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (q->fd < 0) {
        free(q);
        return NULL;
    }
    pthread_mutex_init(&q->mu, NULL);
    return q;
}

void rq_free(struct rq *q)
{
    if (!q)
        return;
    close(q->fd);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

int rq_fd(const struct rq *q)
{
    return q->fd;
}

static void signal_fd(struct rq *q)
{
    if (atomic_exchange(&q->armed, 1))
        return;
    uint64_t one = 1;
    ssize_t w = write(q->fd, &one, sizeof(one));
    (void)w;
}

void rq_push(struct rq *q, struct rq_item *it)
{
    it->next = NULL;
    it->pushed = clock_mono();
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = it;
    else
        q->head = it;
    q->tail = it;
    q->n++;
    pthread_mutex_unlock(&q->mu);
    signal_fd(q);
}

void rq_kick(struct rq *q)
{
    signal_fd(q);
}

struct rq_item *rq_take(struct rq *q, int max, int *n_out)
{
    pthread_mutex_lock(&q->mu);
    struct rq_item *batch = q->head, *last = NULL;
    int n = 0;
    for (struct rq_item *it = q->head; it && n < max; it = it->next, n++)
        last = it;
    if (last) {
        q->head = last->next;
        if (!q->head)
            q->tail = NULL;
        last->next = NULL;
    }
    q->n -= (size_t)n;
    int more = q->head != NULL;
    pthread_mutex_unlock(&q->mu);
    if (more)
        signal_fd(q);
    *n_out = n;
    return n ? batch : NULL;
}

size_t rq_waiting(struct rq *q, double *oldest_age_ms)
{
    pthread_mutex_lock(&q->mu);
    size_t n = q->n;
    double pushed = q->head ? q->head->pushed : 0;
    pthread_mutex_unlock(&q->mu);
    *oldest_age_ms = n ? (clock_mono() - pushed) * 1000.0 : 0;
    return n;
}

void rq_drain_fd(struct rq *q)
{
    uint64_t v;
    ssize_t r = read(q->fd, &v, sizeof(v));
    (void)r;
    /* After the read: a signal between the two skipped its write, and the take that follows
     * sees its item; a signal after this writes again. Cleared first, a signal in between would
     * be read here and leave the flag set over an empty fd, every later wake-up skipped. */
    atomic_store(&q->armed, 0);
}

int rq_run(struct rq *q, struct db *db, int max)
{
    int n = 0;
    rq_drain_fd(q);
    for (struct rq_item *it = rq_take(q, max, &n), *next; it; it = next) {
        next = it->next; /* write frees it */
        it->write(it, db);
    }
    return n > 0;
}
