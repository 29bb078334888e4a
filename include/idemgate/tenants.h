#ifndef IDEMGATE_TENANTS_H
#define IDEMGATE_TENANTS_H

#include "idemgate/db.h"

/* The tenant directory (issue 23 §1): every live tenant's bearer-token hash → its id and name, in
 * memory, so that no statement resolves a token and every statement names its tenant_id (the
 * column a distributed database routes by). An entry answers from memory only while the database
 * confirmed it live within TENANTS_MAX_AGE_S: a revoked token stops working within that bound.
 * The whole directory is read again every TENANTS_REFRESH_S (tenants_refresh_due, then
 * tenants_refresh on a database worker); a token not in memory — a tenant added a moment ago, or
 * an entry past its age — is read once, by itself (tenants_get), and a token that is no live
 * tenant's is refused for TENANTS_MAX_AGE_S without another read. Safe from any thread. */

#define TENANTS_REFRESH_S 1.0
#define TENANTS_MAX_AGE_S 2.0
/* Tokens remembered as no tenant's, at most (a flood of made-up tokens costs memory this big). */
#define TENANTS_MAX_REFUSED 4096

struct tenant {
    long long id;
    char name[72];
};

/* 1 and *out when token_hash (64 hex digits) is a live tenant's, confirmed within the bound; -1
 * when it was confirmed no tenant's within it; 0 when memory cannot tell (tenants_get can). */
int tenants_lookup(const char *token_hash, struct tenant *out);

/* The tenant id token_hash was a live tenant's at the directory's last read of it, however long
 * ago, else 0 (not a proof it still is: for sharing memory and queues between callers, never
 * for answering one). */
long long tenants_known(const char *token_hash);

/* The tenant of token_hash, from memory or else from the database with db: STORE_OK, STORE_EAUTH
 * (no live tenant has it) or a store error (the database could not tell). */
int tenants_get(struct db *db, const char *token_hash, struct tenant *out);

/* 1 when a refresh is due and the caller is to run it (tenants_refresh, then it is no longer
 * pending, success or not); 0 otherwise. */
int tenants_refresh_due(void);
/* Reads every live tenant with db (a database worker's connection); db NULL only marks the
 * refresh done (it is tried again after the interval). */
void tenants_refresh(struct db *db);

/* Forgets every entry (tests; shutdown). */
void tenants_fini(void);

#endif
