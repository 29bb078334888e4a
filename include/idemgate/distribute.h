#ifndef IDEMGATE_DISTRIBUTE_H
#define IDEMGATE_DISTRIBUTE_H

#include "idemgate/db.h"

#include <stddef.h>

/* Distribution of the schema on Citus (`idemgate migrate --citus`, deploy/SCALING.md): the
 * tables every tenant shares are reference tables, the tenant's own are distributed by tenant_id
 * and co-located with operations, and the per-tenant functions run on the tenant's worker. Run
 * after the migrations, on the coordinator; each step is skipped when already done. */

enum dist_kind { DIST_REFERENCE, DIST_TENANT, DIST_FUNCTION };

struct dist_step {
    enum dist_kind kind;
    const char *name; /* a table, or a function's signature */
};

/* The steps, in the order Citus needs them (a table is distributed after those it references).
 * Pure. */
const struct dist_step *dist_steps(size_t *n);

/* The SQL of one step: a statement that does it unless it is done. 0, or -1 when out[cap] is too
 * small. Pure. */
int dist_step_sql(const struct dist_step *s, char *out, size_t cap);

/* Runs every step on db (a Citus coordinator). 0, or a negative store_err (the database is not
 * Citus, or a step failed: logged). */
__attribute__((warn_unused_result)) int dist_run(struct db *db);

#endif
