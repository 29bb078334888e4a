#ifndef IDEMGATE_MIGRATE_H
#define IDEMGATE_MIGRATE_H

#include "idemgate/db.h"

/* Schema migrations, embedded in the binary from migrations/NNNN_name.sql at build time. */
struct migration {
    int version;
    const char *name;
    const char *sql;
};

extern const struct migration migrations[];
extern const int migrations_count;

/* The version of the newest embedded migration. */
int migrate_latest(void);

/* Applies, in order, every migration newer than the database's, each in its own transaction and
 * recorded in schema_migrations with the SHA-256 of its text, all under a session advisory lock
 * so that replicas starting together apply each migration exactly once. Returns 0, or a
 * negative store_err: STORE_ECONFLICT when an applied migration's text differs from the one
 * recorded (edited after it was applied: the others are still applied; migrate_changed says
 * which, logged once, and /readyz is not ready). */
__attribute__((warn_unused_result)) int migrate_run(struct db *db);
/* The version of an applied migration found changed by migrate_run, or 0. */
int migrate_changed(void);

#endif
