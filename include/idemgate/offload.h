#ifndef IDEMGATE_OFFLOAD_H
#define IDEMGATE_OFFLOAD_H

/* A small pool of threads fed by a queue: the API's database workers. A server thread never
 * waits on the database or on a provider: it suspends the request and queues the work here
 * (api_offload), so a slow database stalls these threads, never /healthz, replays answered from
 * memory or the accepting of connections. Items are intrusive: queueing allocates nothing. */

struct offload_item {
    void (*fn)(void *arg);
    void *arg;
    struct offload_item *next; /* the pool's */
};

struct offload;

/* Starts n threads. NULL when it cannot. */
__attribute__((warn_unused_result)) struct offload *offload_start(int n);
/* Queues it: it->fn(it->arg) runs once on a pool thread. 0, or -1 when the pool is closed (the
 * item is not taken). */
__attribute__((warn_unused_result)) int offload_submit(struct offload *o, struct offload_item *it);
/* Refuses new items, runs every queued one, joins the threads. The structure stays valid:
 * offload_submit then answers -1. Accepts NULL; a second call does nothing. */
void offload_close(struct offload *o);
/* Closes (if needed) and frees. Accepts NULL. */
void offload_free(struct offload *o);

#endif
