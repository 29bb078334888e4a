#include "idemgate/migrate.h"

#include "idemgate/crypto.h"
#include "idemgate/log.h"

#include <libpq-fe.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The version of an applied migration whose text changed since (migrate_changed), or 0. */
static atomic_int changed;

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

/* Whether migration `version` is recorded: 1, 0, or -1 when the table cannot be read; and the
 * SHA-256 of the text applied, into sha ("" when none was recorded: applied by a binary older
 * than the record). Each is looked up rather than compared with the newest applied, so a
 * migration merged below a newer one (numbers handed out to branches worked on side by side) is
 * still applied. Migrations are additive and independent of their neighbours' order. */
static int applied(PGconn *c, int version, char sha[CRYPTO_SHA256_HEX])
{
    char sql[128];
    snprintf(sql, sizeof(sql),
             "SELECT coalesce(sha256, '') FROM schema_migrations WHERE version = %d", version);
    PGresult *r = PQexec(c, sql);
    int rc = PQresultStatus(r) == PGRES_TUPLES_OK ? PQntuples(r) > 0 : -1;
    sha[0] = '\0';
    if (rc > 0)
        snprintf(sha, CRYPTO_SHA256_HEX, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return rc;
}

/* A migration applied is never run again: one whose text changed since (edited in place) would
 * leave this database without the change, silently — its statements then failing, or worse,
 * behaving as the older text did. Its SHA-256 is recorded when it is applied, and compared at
 * every run (the operator decides what a difference needs: a migration of its own for the
 * change). One applied before the record (no SHA-256) is recorded as it is now — what it was
 * then cannot be known. 0, 1 when the text differs from the one recorded, or -1 when the
 * record could not be written (logged; tried again at the next run). */
static int check_applied(PGconn *c, const struct migration *m, const char *recorded,
                         const char *now)
{
    if (*recorded)
        return strcmp(recorded, now) == 0 ? 0 : 1;
    char sql[160];
    snprintf(sql, sizeof(sql),
             "UPDATE schema_migrations SET sha256 = '%s' WHERE version = %d AND sha256 IS NULL",
             now, m->version);
    return exec_ok(c, sql, m->name);
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
                step) < 0 ||
        exec_ok(c, "ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS sha256 text", step) < 0)
        goto failed;
    for (int i = 0; i < migrations_count; i++) {
        const struct migration *m = &migrations[i];
        char recorded[CRYPTO_SHA256_HEX], now[CRYPTO_SHA256_HEX];
        crypto_sha256_hex(m->sql, strlen(m->sql), now);
        step = m->name;
        int done = applied(c, m->version, recorded);
        if (done < 0)
            goto failed;
        if (done) {
            int diff = check_applied(c, m, recorded, now);
            if (diff < 0)
                goto failed;
            /* The later migrations are still applied: this binary's statements need them
             * (its workers run whatever migrate says); the difference is reported, the
             * replica unready, the run's answer STORE_ECONFLICT. */
            if (diff && !atomic_exchange(&changed, m->version))
                LOG(LOG_ERROR, "migration_changed", LI("version", m->version),
                    LS("name", m->name), LS("recorded_sha256", recorded), LS("sha256", now),
                    LS("note", "this migration's text differs from the one applied to this "
                               "database; a change to an applied migration is never applied: "
                               "it needs a migration of its own"));
            continue;
        }
        if (exec_ok(c, "BEGIN", step) < 0)
            goto failed;
        if (exec_ok(c, m->sql, step) < 0) {
            PQclear(PQexec(c, "ROLLBACK"));
            goto failed;
        }
        char ins[320];
        snprintf(ins, sizeof(ins),
                 "INSERT INTO schema_migrations (version, name, sha256) VALUES (%d, '%s', '%s')",
                 m->version, m->name, now);
        if (exec_ok(c, ins, step) < 0 || exec_ok(c, "COMMIT", step) < 0) {
            PQclear(PQexec(c, "ROLLBACK"));
            goto failed;
        }
        LOG(LOG_INFO, "migration_applied", LI("version", m->version), LS("name", m->name));
    }
    (void)exec_ok(c, "SELECT pg_advisory_unlock(" MIGRATE_LOCK_KEY ")", "unlock");
    return atomic_load(&changed) ? STORE_ECONFLICT : STORE_OK;
failed:
    if (locked)
        (void)exec_ok(c, "SELECT pg_advisory_unlock(" MIGRATE_LOCK_KEY ")", "unlock");
    LOG(LOG_ERROR, "migrate_failed", LS("step", step), LS("error", "see previous line"));
    return STORE_EINTERNAL;
}

int migrate_changed(void)
{
    return atomic_load(&changed);
}
