#ifndef IDEMGATE_RESULTQ_H
#define IDEMGATE_RESULTQ_H

#include "idemgate/db.h"

#include <stddef.h>

/* Results of provider calls waiting for a thread with a database connection to write them. The
 * call engine's threads (engine.h) never touch the database: a call's end is pushed here, and a
 * pool thread (wpool.h: its chores) runs the item's write with its own connection. Items are
 * intrusive: the caller embeds a struct rq_item in what it allocated before the call, so a push
 * cannot fail. Every function is safe from any thread. */

struct rq_item {
    /* Writes the result with db and frees what the item belongs to. */
    void (*write)(struct rq_item *it, struct db *db);
    struct rq_item *next;
    double pushed; /* the queue's: clock_mono() when pushed */
};

struct rq;

/* A new queue, or NULL when out of memory (or out of descriptors). */
__attribute__((warn_unused_result)) struct rq *rq_new(void);
/* Frees an empty queue (q may be NULL). */
void rq_free(struct rq *q);
/* An eventfd readable while items wait (rq_run reads it). */
int rq_fd(const struct rq *q);
/* Queues it (oldest first) and makes rq_fd readable. */
void rq_push(struct rq *q, struct rq_item *it);
/* Makes rq_fd readable (another queue's items wait, read by the same thread). */
void rq_kick(struct rq *q);
/* Reads rq_fd (before taking items, so that a push after it is never missed). The only reader
 * of rq_fd: a push or kick writes it only when no write is pending since the last drain. */
void rq_drain_fd(struct rq *q);
/* Takes up to max waiting items, oldest first, as a chain (NULL: none); *n gets how many. When
 * more wait after them, rq_fd stays readable. */
struct rq_item *rq_take(struct rq *q, int max, int *n);
/* How many items wait, and how long the oldest has waited (ms; 0 when none). */
size_t rq_waiting(struct rq *q, double *oldest_age_ms);
/* Runs the writes of up to max waiting items with db; 1 when it ran any, 0 when none waited. When
 * more wait after them, rq_fd stays readable so that other threads help. */
int rq_run(struct rq *q, struct db *db, int max);

#endif
