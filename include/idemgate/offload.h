#ifndef IDEMGATE_OFFLOAD_H
#define IDEMGATE_OFFLOAD_H

#include <stddef.h>

/* A small pool of threads fed by a queue: the API's database workers. A server thread never
 * waits on the database or on a provider: it suspends the request and queues the work here
 * (api_offload), so a slow database stalls these threads, never /healthz, replays answered from
 * memory or the accepting of connections. Items are intrusive: queueing allocates nothing.
 *
 * The queue is fair between callers: a request's item waits in one of OFFLOAD_LANES lanes, its
 * caller's (api.c's key: a tenant, the operator, a provider's webhooks, the probes), and the
 * threads take one item from each lane that holds any in turn — a tenant's thousand queued reads
 * delay another tenant's request by one item of theirs, not by the thousand. A lane is its
 * caller's alone while it holds any of its items: a caller with items queued gets a free lane
 * (the first from the home lane its key hashes to), so two callers share a lane only when more
 * than OFFLOAD_LANES - 1 callers have items waiting at once (a lane hashed to by a fixed,
 * computable hash alone was shared for good by the tenants whose ids collided, and by
 * unauthenticated webhooks or probes with the tenants whose lane theirs hashed to). The pool's
 * own upkeep (the tenant directory's and the limits' refreshes, which every request's
 * authentication needs) goes before any request. The callers no live tenant is known as (no
 * token, a made-up one) share one lane of their own, OFFLOAD_UNTRUSTED_KEY's, which no other
 * caller ever gets: a flood of made-up tokens never shares a tenant's lane. */

#define OFFLOAD_LANES 64
#define OFFLOAD_UNTRUSTED_KEY "unknown"
/* A caller's key is told apart from another by its length and first OFFLOAD_KEY_MAX bytes. */
#define OFFLOAD_KEY_MAX 96

struct offload_item {
    void (*fn)(void *arg);
    void *arg;
    struct offload_item *next; /* the pool's */
    int lane;                  /* the pool's: -1 upkeep, else the caller's lane */
};

struct offload;

/* Starts n threads. NULL when it cannot. */
__attribute__((warn_unused_result)) struct offload *offload_start(int n);
/* Queues upkeep: it->fn(it->arg) runs once on a pool thread, before any queued request. 0, or -1
 * when the pool is closed (the item is not taken). */
__attribute__((warn_unused_result)) int offload_submit(struct offload *o, struct offload_item *it);
/* Queues a caller's item in the lane of key[0..len) (above), as offload_submit. */
__attribute__((warn_unused_result)) int offload_submit_as(struct offload *o, struct offload_item *it,
                                                          const char *key, size_t len);
/* The home lane of a caller's key: 0 for OFFLOAD_UNTRUSTED_KEY, else 1..OFFLOAD_LANES-1 (where its
 * search for a free lane begins). Pure. */
int offload_lane(const char *key, size_t len);
/* Refuses new items, runs every queued one, joins the threads. The structure stays valid:
 * offload_submit then answers -1. Accepts NULL; a second call does nothing. */
void offload_close(struct offload *o);
/* Closes (if needed) and frees. Accepts NULL. */
void offload_free(struct offload *o);

#endif
