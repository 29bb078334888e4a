#ifndef IDEMGATE_LIMITS_H
#define IDEMGATE_LIMITS_H

#include "idemgate/config.h"

/* Per-tenant limits of this replica (issue 14 §2): requests per second (a token bucket with a
 * burst) and `Prefer: wait` connections held. Each tenant's values come from the tenant_limits
 * table (NULL: the configuration's defaults), read again every LIMITS_REFRESH_S by a database
 * worker; until a tenant is known (a new token, or before the first read) it is not limited —
 * the store decides its token anyway. Over a limit the request is answered 429 with Retry-After
 * and nothing is recorded. The counts are this replica's: a tenant's limit across N replicas
 * behind a balancer is up to N times the value. Safe from any thread. */

#define LIMITS_REFRESH_S 5.0

struct db;

/* A token bucket: `tokens` available at `at` (seconds). */
struct lim_bucket {
    double tokens, at;
};

/* Takes one token at time now from a bucket refilled at rate per second up to burst (burst < 1
 * counts as 1). Returns 0 when one was taken, or the seconds until one will be available. rate
 * <= 0: no limit (always 0). Pure. */
double lim_take(struct lim_bucket *b, double now, double rate, double burst);
/* A tenant's value or, when it has none (-1), the default. Pure. */
int lim_value(int tenant_value, int default_value);
/* Retry-After seconds for a wait of s seconds: at least 1, rounded up. Pure. */
int lim_retry_after(double s);

int limits_init(const struct cfg *cfg);
void limits_fini(void);

/* 1 when a refresh is due and the caller is to run it (limits_refresh, then it is no longer
 * pending, success or not); 0 otherwise. */
int limits_refresh_due(void);
/* Reads every live tenant's limits with db (a database worker's connection). */
void limits_refresh(struct db *db);

/* A request of the tenant whose token hashes to token_hash: 0 when admitted, else the
 * Retry-After in seconds. */
int limits_admit(const char *token_hash);
/* A `Prefer: wait` connection of that tenant: 0 when admitted, else the Retry-After in seconds.
 * *counted says whether it was counted: then limits_wait_end must follow, once. */
int limits_wait_begin(const char *token_hash, int *counted);
void limits_wait_end(const char *token_hash);

#endif
