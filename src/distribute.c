#include "idemgate/distribute.h"

#include "idemgate/log.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <string.h>

static const struct dist_step steps[] = {
    {DIST_REFERENCE, "tenants"},
    {DIST_TENANT, "operations"},
    {DIST_TENANT, "attempts"},
    {DIST_TENANT, "archive_outputs"},
    {DIST_TENANT, "tenant_budgets"},
    {DIST_TENANT, "tenant_limits"},
    {DIST_TENANT, "key_tombstones"},
    {DIST_TENANT, "tenant_spend_retired"},
    {DIST_REFERENCE, "provider_breakers"},
    {DIST_REFERENCE, "webhook_events"},
    {DIST_REFERENCE, "webhook_parked"},
    /* Called outside a transaction, Citus runs it as one command on the tenant's worker. */
    {DIST_FUNCTION, "idemgate_intake(bigint, text, text, text, smallint, text, text, text, text, "
                    "text, bytea, integer, text, text, integer, text, text, integer, bigint, "
                    "text, boolean, timestamptz)"},
    {DIST_FUNCTION, "idemgate_finish(bigint, text, bigint, text, integer, jsonb, bytea, text, "
                    "text, float8, float8, text, integer, bigint, float8, text, text, integer, "
                    "integer, jsonb, text, bigint, text, jsonb, boolean, bigint)"},
    {DIST_FUNCTION, "idemgate_finish(bigint, text, bigint, text, integer, jsonb, bytea, text, "
                    "text, float8, float8, text, integer, bigint, float8, text, text, integer, "
                    "integer, jsonb, text, bigint, text, jsonb, boolean, bigint, jsonb)"},
    /* Called by the three below on the worker: it must be there too. */
    {DIST_FUNCTION, "idemgate_settle_ended(bigint, text, boolean, text, bigint, bigint, "
                    "timestamptz, timestamptz)"},
    {DIST_FUNCTION, "idemgate_cancel(bigint, text)"},
    {DIST_FUNCTION, "idemgate_claim_lost(bigint, text)"},
    {DIST_FUNCTION, "idemgate_archive_claim(bigint, text, integer, text[], integer)"},
    {DIST_FUNCTION, "idemgate_resolve(bigint, text, text, text, text, text, text)"},
    {DIST_FUNCTION, "idemgate_resolve(bigint, text, text, text, text, text, text, bigint)"},
    {DIST_FUNCTION, "idemgate_regenerate(bigint, text, text, text, text, smallint, integer)"},
    {DIST_FUNCTION, "idemgate_janitor(bigint, integer)"},
    {DIST_FUNCTION, "idemgate_budget_recount(bigint, boolean)"},
};

const struct dist_step *dist_steps(size_t *n)
{
    *n = sizeof(steps) / sizeof(steps[0]);
    return steps;
}

int dist_step_sql(const struct dist_step *s, char *out, size_t cap)
{
    int w;
    /* A table already in Citus's metadata is left as it is. */
    static const char undone[] =
        " WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = '%s'::regclass)";
    char cond[256];
    if (s->kind != DIST_FUNCTION &&
        (size_t)snprintf(cond, sizeof(cond), undone, s->name) >= sizeof(cond))
        return -1;
    switch (s->kind) {
    case DIST_REFERENCE:
        w = snprintf(out, cap, "SELECT create_reference_table('%s')%s", s->name, cond);
        break;
    case DIST_TENANT:
        w = strcmp(s->name, "operations") == 0
                ? snprintf(out, cap, "SELECT create_distributed_table('%s', 'tenant_id')%s",
                           s->name, cond)
                : snprintf(out, cap,
                           "SELECT create_distributed_table('%s', 'tenant_id', "
                           "colocate_with => 'operations')%s",
                           s->name, cond);
        break;
    default:
        w = snprintf(out, cap,
                     "SELECT create_distributed_function('%s'::regprocedure, '$1', "
                     "colocate_with := 'operations')",
                     s->name);
        break;
    }
    return w < 0 || (size_t)w >= cap ? -1 : 0;
}

static int exec_step(PGconn *c, const char *sql, const char *what)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    int ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (!ok)
        LOG(LOG_ERROR, "distribute_failed", LS("step", what), LS("error", PQresultErrorMessage(r)));
    PQclear(r);
    return ok ? 0 : -1;
}

int dist_run(struct db *db)
{
    if (store_db_ensure(db) < 0)
        return STORE_EUNAVAIL;
    PGconn *c = store_db_pgconn(db);
    PGresult *r = PQexec(c, "SELECT 1 FROM pg_extension WHERE extname = 'citus'");
    int citus = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
    PQclear(r);
    if (!citus) {
        LOG(LOG_ERROR, "distribute_failed", LS("step", "citus"),
            LS("error", "the database has no citus extension (CREATE EXTENSION citus, and add "
                        "the workers, first)"));
        return STORE_EINTERNAL;
    }
    /* No trigger is left since 0025: the setting is for one an operator adds. */
    if (exec_step(c, "SET citus.enable_unsafe_triggers = on", "settings") < 0)
        return STORE_EINTERNAL;
    size_t n;
    const struct dist_step *s = dist_steps(&n);
    for (size_t i = 0; i < n; i++) {
        char sql[512];
        if (dist_step_sql(&s[i], sql, sizeof(sql)) < 0 || exec_step(c, sql, s[i].name) < 0)
            return STORE_EINTERNAL;
        LOG(LOG_INFO, "distributed", LS("name", s[i].name),
            LS("as", s[i].kind == DIST_REFERENCE ? "reference"
                     : s[i].kind == DIST_TENANT  ? "by tenant_id"
                                                 : "function on the tenant's worker"));
    }
    /* The gateway's reads of every shard (which tenants have due work, a webhook's tenants) are
     * small and many: run each one's tasks over the one cached connection per worker. With
     * Citus's default pool (16), such a read in a new transaction opened new connections to
     * the workers every time: 150–470 ms instead of ~17 ms on the loopback cluster, enough to
     * time a provider's webhook delivery out (deploy/SCALING.md). New sessions take it up. */
    if (exec_step(c,
                  "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET "
                  "citus.max_adaptive_executor_pool_size = 1', current_database()); END $$",
                  "executor pool") < 0)
        return STORE_EINTERNAL;
    LOG(LOG_INFO, "distributed", LS("name", "citus.max_adaptive_executor_pool_size"),
        LS("as", "1 for this database"));
    return STORE_OK;
}
