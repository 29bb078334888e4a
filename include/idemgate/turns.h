#ifndef IDEMGATE_TURNS_H
#define IDEMGATE_TURNS_H

#include "idemgate/db.h"

#include <pthread.h>
#include <stddef.h>

/* Whose turn it is: claims one tenant at a time (issue 23). A claim across all tenants (one
 * `FOR UPDATE SKIP LOCKED` over every tenant's rows, or the recursive fair pick before it) is
 * what a sharded PostgreSQL (Citus) cannot run and what makes one busy tenant's rows the cost of
 * everyone's claim. Instead each kind of work (creates to send, operations in doubt, polls,
 * archive copies, expired leases) keeps, per process, the tenants that had due work at its last
 * read — one cheap statement, TURNS_DUE — and claims from them in turn, each claim a
 * single-tenant statement. A tenant whose claim finds nothing leaves the ring until the next
 * read.
 *
 * A round serves the tenants in the order of their ids, each after the one served last: one claim
 * each. The ring is read again when a round is over (so a tenant whose first job came meanwhile
 * is in the next round, whatever another tenant's backlog: it waits for at most one claim of each
 * other tenant with due work), when news of work arrived since the last read (wake_news: this
 * replica's intake, or another replica's NOTIFY), and at least every TURNS_REFRESH_MS. With one
 * busy tenant a round is one claim: one read per claim, which is why the read must not grow with
 * the backlog. */

#define TURNS_REFRESH_MS 200

/* A ring's read: the tenants with rows of `table` where `cond` holds (cond names the table's
 * columns unqualified). On PostgreSQL a skip scan along an index that leads with the tenant:
 * the first due row after the last tenant found, again and again — one index descent per tenant
 * with due work, whatever the backlog behind each (a `GROUP BY tenant_id` reads every due row:
 * 2.2–2.6 ms a read, one read per claim of a busy tenant, with ~30 000 archive copies waiting).
 * A distributed database runs no recursive query over a sharded table: there the grouped read,
 * which each shard runs in parallel (db_stmt.sql_distributed). */
#define TURNS_DUE(table, cond)                                                                     \
    "WITH RECURSIVE t AS ((SELECT tenant_id FROM " table " WHERE " cond                          \
    " ORDER BY tenant_id LIMIT 1) UNION ALL SELECT (SELECT tenant_id FROM " table                 \
    " WHERE tenant_id > t.tenant_id AND " cond " ORDER BY tenant_id LIMIT 1) "                    \
    " FROM t WHERE t.tenant_id IS NOT NULL) SELECT tenant_id FROM t WHERE tenant_id IS NOT NULL"
#define TURNS_DUE_DISTRIBUTED(table, cond)                                                         \
    "SELECT tenant_id FROM " table " WHERE " cond " GROUP BY tenant_id"

/* The pure part: a sorted set of tenant ids and the one served last. */
struct turn_ring {
    long long *ids; /* ascending, no duplicates */
    size_t n, cap;
    long long last; /* the tenant served last (0: none yet) */
};
/* Replaces the ids (any order, duplicates allowed); the one served last is kept. 0, or -1 when
 * out of memory (the ring is then empty). */
int turn_ring_set(struct turn_ring *r, const long long *ids, size_t n);
/* Whether the round is over: no tenant after the one served last (or the ring is empty). */
int turn_ring_wraps(const struct turn_ring *r);
/* The next tenant after the one served last (wrapping), now the one served last; 0 when empty. */
int turn_ring_next(struct turn_ring *r, long long *tenant);
/* Removes a tenant (its claim found nothing). */
void turn_ring_drop(struct turn_ring *r, long long tenant);
/* Gives back a turn taken by turn_ring_next (the tenant served, the one served last before
 * it): the tenant is next again — unless another turn was taken since. */
void turn_ring_keep(struct turn_ring *r, long long tenant, long long before);
void turn_ring_fini(struct turn_ring *r);

/* One kind of work's ring, shared by the threads that claim it. Initialise with TURNS_INIT. */
struct turns {
    pthread_mutex_t mu;
    struct turn_ring ring;
    double read_at;     /* clock_mono of the last read (0: never) */
    unsigned long news; /* wake_news() before the last read */
};
#define TURNS_INIT                                                                                 \
    {                                                                                              \
        .mu = PTHREAD_MUTEX_INITIALIZER                                                            \
    }

/* The tenants with due work (a store read): STORE_OK with *ids (malloc'd) and *n, or an error. */
typedef int (*turns_read_fn)(struct db *db, void *arg, long long **ids, size_t *n);
/* One tenant's claim: STORE_OK (claimed), STORE_ENOTFOUND, an error, or TURN_KEPT: the claim
 * was not made, for a reason that is not the tenant's (no room left on this replica), and the
 * tenant keeps its turn — it is served first at the next claim. */
enum { TURN_KEPT = 1 };
typedef int (*turns_claim_fn)(struct db *db, long long tenant, void *arg);

/* Claims from the tenants in turn until one claim succeeds: STORE_OK, STORE_ENOTFOUND when no
 * tenant had anything, or the first error (STORE_ERETRY for a turn kept). */
int turns_claim(struct turns *t, struct db *db, turns_read_fn read, turns_claim_fn claim,
                void *arg);

/* The tenants a due-work statement s returns (one tenant_id per row; s takes $1 providers, a
 * text[] literal, when providers is not NULL): a ring's read. STORE_OK with *ids (malloc'd, the
 * caller frees) and *n, or an error. */
__attribute__((warn_unused_result)) int turns_read(struct db *db, const struct db_stmt *s,
                                                   const char *providers, long long **ids,
                                                   size_t *n);

#endif
