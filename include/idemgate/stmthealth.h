#ifndef IDEMGATE_STMTHEALTH_H
#define IDEMGATE_STMTHEALTH_H

#include <stddef.h>

/* Which statements the database refuses to run at all (issue 23 §5). A replica whose claims or
 * result writes fail on every call — a schema the binary does not match, a database that does not
 * support a statement's shape (Citus: "non-IMMUTABLE functions are not allowed …") — must not say
 * it is ready. db.c reports every statement error here; /readyz lists the statements whose last
 * run failed with such an error within SH_WINDOW_S and is not ready while any does.
 *
 * Only errors that say the statement cannot run whatever its arguments count (SQLSTATE classes
 * 0A feature not supported, 42 syntax or undefined object, XX internal, 2F/38/39 routine
 * errors). A data error one request's values caused (class 22), a conflict, a lock timeout, a
 * lost connection, or what a transaction pooler causes (26000 a statement the server forgot,
 * 42P05 one it already has) does not: one client must not be able to take every replica out of
 * service. A statement's next successful run clears it. */

#define SH_WINDOW_S 300
#define SH_MAX 64 /* statements tracked at once (a schema this broken is not ready anyway) */

/* Whether sqlstate is of a class that says the statement cannot run. Pure. */
int sh_sqlstate_counts(const char *sqlstate);
/* Statement stmt (a name with static storage: the db_stmt's) failed with sqlstate. */
void sh_failed(const char *stmt, const char *sqlstate);
/* Statement stmt ran. Cheap when nothing is failing (one atomic load). */
void sh_ok(const char *stmt);
/* Calls fn for each statement failing now (last run failed within SH_WINDOW_S); returns how
 * many. */
size_t sh_failing(void (*fn)(const char *stmt, const char *sqlstate, double age_s, void *arg),
                  void *arg);
/* The same at a given instant of clock_mono (the tests' clock). */
void sh_failed_at(const char *stmt, const char *sqlstate, double at);
size_t sh_failing_at(double now,
                     void (*fn)(const char *stmt, const char *sqlstate, double age_s, void *arg),
                     void *arg);

#endif
