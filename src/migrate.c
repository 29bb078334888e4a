#include "idemgate/migrate.h"

#include "idemgate/log.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>

/* Any constant shared by every replica; "idemgate" in ASCII. */
#define MIGRATE_LOCK_KEY "7596839865373921637"

int migrate_latest(void)
{
    return migrations_count ? migrations[migrations_count - 1].version : 0;
}

static int exec_ok(PGconn *c, const char *sql, const char *step)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        LOG(LOG_ERROR, "migrate_failed", LS("step", step), LS("error", PQresultErrorMessage(r)));
        PQclear(r);
        return -1;
    }
    PQclear(r);
    return 0;
}

/* Whether migration `version` is recorded: 1, 0, or -1. Each version is looked up on its own,
 * not compared with the highest one applied: branches developed side by side take numbers that
 * land out of order (0009 may be applied before 0007 is merged), and a lower version merged
 * later must still be applied. */
static int applied(PGconn *c, int version)
{
    char q[128];
    snprintf(q, sizeof(q), "SELECT 1 FROM schema_migrations WHERE version = %d", version);
    PGresult *r = PQexec(c, q);
    int rc = PQresultStatus(r) != PGRES_TUPLES_OK ? -1 : PQntuples(r) > 0;
    PQclear(r);
    return rc;
}

int migrate_run(struct db *db)
{
    if (store_db_ensure(db) < 0)
        return STORE_EUNAVAIL;
    PGconn *c = store_db_pgconn(db);
    const char *step = "lock";
    int locked = 0;
    /* Even CREATE TABLE IF NOT EXISTS races on the catalog when replicas start together, so the
     * lock is taken first and everything else happens under it. */
    if (exec_ok(c, "SELECT pg_advisory_lock(" MIGRATE_LOCK_KEY ")", step) < 0)
        goto failed;
    locked = 1;
    step = "schema_migrations";
    if (exec_ok(c,
                "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, "
                "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
                step) < 0)
        goto failed;
    for (int i = 0; i < migrations_count; i++) {
        const struct migration *m = &migrations[i];
        step = m->name;
        int done = applied(c, m->version);
        if (done < 0)
            goto failed;
        if (done)
            continue;
        if (exec_ok(c, "BEGIN", step) < 0)
            goto failed;
        if (exec_ok(c, m->sql, step) < 0) {
            PQclear(PQexec(c, "ROLLBACK"));
            goto failed;
        }
        char ins[256];
        snprintf(ins, sizeof(ins), "INSERT INTO schema_migrations (version, name) VALUES (%d, '%s')",
                 m->version, m->name);
        if (exec_ok(c, ins, step) < 0 || exec_ok(c, "COMMIT", step) < 0) {
            PQclear(PQexec(c, "ROLLBACK"));
            goto failed;
        }
        LOG(LOG_INFO, "migration_applied", LI("version", m->version), LS("name", m->name));
    }
    (void)exec_ok(c, "SELECT pg_advisory_unlock(" MIGRATE_LOCK_KEY ")", "unlock");
    return STORE_OK;
failed:
    if (locked)
        (void)exec_ok(c, "SELECT pg_advisory_unlock(" MIGRATE_LOCK_KEY ")", "unlock");
    LOG(LOG_ERROR, "migrate_failed", LS("step", step), LS("error", "see previous line"));
    return STORE_EINTERNAL;
}
