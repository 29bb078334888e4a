#ifndef IDEMGATE_DB_H
#define IDEMGATE_DB_H

#include "idemgate/states.h"

#include <stddef.h>

/* The connection layer under store.c and lease.c: one PostgreSQL connection per `struct db`,
 * used by one thread at a time. It reconnects by itself after a failure (the failing call reports
 * STORE_EUNAVAIL, the next call tries again), prepares each statement on a connection the first
 * time that connection runs it, binds parameters by name, maps SQLSTATEs to store errors, and
 * carries LISTEN/NOTIFY. It knows no table of the schema: the statements live beside the
 * functions that use them.
 *
 * A connection the server closed while it sat idle (PostgreSQL restarted, the backend was
 * terminated) is found dead before anything is sent on it and replaced: the call runs on a new
 * connection, with no doubt about what ran. A connection lost after the statement was sent
 * leaves its outcome unknown: the statement runs once more on a new connection only when it is
 * declared rerun_safe (see db_stmt); any other gets STORE_EUNAVAIL and its caller decides (the
 * intake and the fenced writes re-read what the first run may have done).
 *
 * Failover: every connection must reach the primary. A server that accepts no writes (a
 * standby, a primary fenced or demoted) is treated like a lost one: not connected to, replaced
 * when idle once it says so, and a write it refuses (SQLSTATE 25006) drops the session like a
 * lost connection, under the same rerun rule. A multi-host url (host=A,B …
 * target_session_attrs=read-write) then finds the new primary by itself. */

enum store_err {
    STORE_OK = 0,
    STORE_EUNAVAIL = -1,  /* the database cannot be reached: 503 with Retry-After */
    STORE_ERETRY = -2,    /* serialization failure or deadlock: run the statement again */
    STORE_EINTERNAL = -3, /* anything else: a bug or a broken schema */
    STORE_ENOTFOUND = -4, /* no such row (or nothing to do) */
    STORE_EAUTH = -5,     /* no live tenant has that token */
    STORE_ECONFLICT = -6, /* a unique name is taken */
    /* Intake refused by the tenant's budget (nothing recorded): the estimate would pass the
     * day's or the month's amount, or the tenant has its most jobs in flight. */
    STORE_EOVERDAY = -7,
    STORE_EOVERMONTH = -8,
    STORE_EINFLIGHT = -9,
    /* Intake or regeneration of an unpriced request (pricing.h) under an amount budget: refused,
     * nothing recorded — its estimate of 0 would pass any amount. */
    STORE_EUNPRICED = -10,
    /* Intake of a key whose job ended and was deleted by retention (its tombstone answers, the
     * job's id, fingerprint and end state in the store_job): 410, or 422 for another request.
     * Nothing recorded. */
    STORE_EGONE = -11,
};

struct db;

/* 1 when a server reporting these parameters (PQparameterStatus "in_hot_standby" and
 * "default_transaction_read_only"; NULL when not reported) accepts no writes. Such a server is
 * never used: a connection to it is refused (STORE_EUNAVAIL) or, once it reports the change,
 * replaced before its next statement. Pure. */
int db_read_only_server(const char *in_hot_standby, const char *default_read_only);

/* Connects to url. Never fails for an unreachable database: the handle is returned disconnected
 * and each call retries the connection (so a replica started before PostgreSQL comes up by
 * itself). Returns NULL only when out of memory. */
struct db *store_db_open(const char *url);
void store_db_close(struct db *db);
/* 1 when the last call reached the database. */
int store_db_ok(struct db *db);
/* Counts the connections made so far; a change means session state (LISTEN) was lost. */
unsigned store_db_generation(struct db *db);
/* The raw libpq connection (migrate.c and tests of the store only); may be NULL. */
void *store_db_pgconn(struct db *db);
/* Makes sure the connection is up (reconnecting if it is not); 0 or STORE_EUNAVAIL. */
__attribute__((warn_unused_result)) int store_db_ensure(struct db *db);
/* The process id of the connection's server process (what a NOTIFY it sends carries), or 0. */
int store_db_backend_pid(struct db *db);

/* Subscribes this connection to a NOTIFY channel. */
__attribute__((warn_unused_result)) int store_listen(struct db *db, const char *channel);
/* Waits up to timeout_ms for a notification on this connection, or for one of the n_wake
 * descriptors wake_fds to become readable (it is not read), then calls cb(payload, sender_pid,
 * arg) for each notification received; sender_pid is the server process that sent it. Returns
 * the number received, or STORE_EUNAVAIL. */
#define DB_MAX_WAKE_FDS 4
int store_wait_notify(struct db *db, int timeout_ms, const int *wake_fds, int n_wake,
                      void (*cb)(const char *payload, int sender_pid, void *arg), void *arg);

/* A state a statement may move operations between. DB_NEW_ROW as `from`: a row it inserts. */
#define DB_NEW_ROW ST__COUNT
struct db_move {
    int from;         /* enum op_state, or DB_NEW_ROW */
    enum op_state to; /* equal to from: the statement keeps the state (lease, hints) */
};

/* A statement, prepared on each connection the first time it runs there. `params` names $1, $2,
 * … in order (NULL-terminated): the one place where a position gets its meaning; callers bind by
 * name. A statement that writes operations.state declares every move it makes in `moves`, and in
 * `filters` the states it names only to choose (or rule out) rows it does not move; a unit test
 * (test_sql_states) proves each move is an edge of states.c and that every state named in the
 * SQL text is one of these. */
struct db_stmt {
    const char *name;
    const char *sql;
    /* The text prepared instead on a distributed database (Citus: the extension is installed in
     * the database), where the two must differ; NULL: sql everywhere. */
    const char *sql_distributed;
    const char *const *params;
    const struct db_move *moves;  /* terminated by {.from = -1} ; NULL: writes no state */
    const enum op_state *filters; /* terminated by ST__COUNT; may be NULL */
    /* 1 when a second run cannot double an effect nor answer differently: it only reads, or its
     * writes are keyed so that a second run changes nothing (ON CONFLICT DO NOTHING, a DELETE
     * by key). db_run then runs it once more on a new connection after a connection lost with
     * the statement in flight. Never set it on a claim, a fenced write or an insert of history. */
    int rerun_safe;
};
#define DB_PARAMS(...) ((const char *const[]){__VA_ARGS__, NULL})
/* A literal state test on a row found by its key (`"AND " KEYED_STATE("o.state") " = 'x'"`):
 * written as an expression no partial queue index's predicate matches, so that the planner finds
 * the row by its key. A bare `state = 'prepared'` lets it prove a queue index usable (the
 * tenant's prepared rows, say) and, with a table's statistics still young, scan that whole queue
 * for the one row: measured 29 ms over 10,294 rows for one archive plan, under load. */
#define KEYED_STATE(col) "(" col " || '')"
/* The statement's clock where a distributed database refuses now() itself — inside CASE or
 * COALESCE of an UPDATE, and in RETURNING (Citus: "non-IMMUTABLE functions are not allowed"):
 * a scalar sub-select, the same transaction timestamp on PostgreSQL, and a constant of the
 * shard's own statement on Citus. DB_EPOCH(x) is the Unix seconds of timestamptz x with only
 * immutable operations (extract on a timestamptz is only stable). */
#define DB_NOW "(SELECT now())"
#define DB_EPOCH(x) "extract(epoch FROM (" x ") - 'epoch'::timestamptz)::float8"
/* A filter true of every row of an unnested batch (ordinal column n) that a planner estimates
 * as keeping one row: its plan kept for the statement then looks each row up by its key, with the
 * table's statistics young or old. Without it, a plan made while the table is small (a new
 * database) joins the batch to a scan of the whole table, and keeps doing so as the table grows
 * until its statistics are next gathered. */
#define DB_ROWS_FEW(n) n " BETWEEN 1 AND 1000000000"
#define DB_MOVES(...) ((const struct db_move[]){__VA_ARGS__, {-1, ST_PREPARED}})
#define DB_FILTERS(...) ((const enum op_state[]){__VA_ARGS__, ST__COUNT})

/* 1 when s declares the move from → to (a keep, from == to, included). Pure. */
int db_stmt_moves(const struct db_stmt *s, int from, enum op_state to);

/* One bound parameter. Build them with the p_ helpers; `value` NULL is SQL NULL. */
struct param {
    const char *name;
    const char *value;
    int len;    /* bytes of a binary value */
    int binary; /* sent as raw bytes (bytea) */
    int is_num; /* the value is the text in num */
    int lossy;  /* a diagnostic text: bound with bytes that are not UTF-8 as U+FFFD */
    char num[32];
};
struct param p_text(const char *name, const char *value);
/* A text whose exact bytes do not matter (a provider's message, its headers, its status word;
 * the lists of outputs read from its answer, whose bytes the stored body keeps): bytes that are
 * not UTF-8 — which a UTF8 database refuses, and the write with them, the paid answer with it —
 * are bound as U+FFFD. Never an id, a key or a URL of its own: those are refused as they are
 * (and a provider's task id or poll URL that is not UTF-8 is not read: provider.c, attempt.c). */
struct param p_text_lossy(const char *name, const char *value);
struct param p_bytes(const char *name, const void *value, size_t len);
struct param p_int(const char *name, long long value);
struct param p_float(const char *name, double value); /* six decimals */
struct param p_bool(const char *name, int value);
struct param p_null(const char *name);

struct pg_result;

/* Whether db holds a connection that is up (after a statement failed: the database could not be
 * reached, rather than a server that answered with an error). */
int db_connected(const struct db *db);
/* 1 when the last statement run could not even connect (the server down, restarting, out of
 * reach): nothing anywhere was answered — unlike an error the server answered, which only looks
 * like a lost connection (a Citus worker out of reach, 08006 from a healthy coordinator). */
int db_unreachable(const struct db *db);

/* Runs s with the parameters given (each of s->params bound exactly once, in any order). On
 * success *out holds the result (the caller PQclears it). */
__attribute__((warn_unused_result)) int db_run(struct db *db, const struct db_stmt *s,
                                               const struct param *ps, size_t n,
                                               struct pg_result **out);
/* Runs s once per row (ps[i]: row i's n parameters) in ONE transaction and one round trip (libpq
 * pipeline mode): one commit, and so one WAL flush, for the whole batch. On STORE_OK the batch is
 * committed and outs[i] holds row i's result (the caller PQclears each). On an error the whole
 * batch is rolled back (STORE_ERETRY: a statement failed and aborted the rest; the caller may run
 * the rows one by one to find the bad one) — except STORE_EUNAVAIL, after which the outcome is
 * unknown (the COMMIT may have landed): only idempotent statements belong in a batch. outs[] is
 * then all NULL. The rows should be ordered by the keys they lock, so that two batches on two
 * connections cannot deadlock. */
__attribute__((warn_unused_result)) int db_run_batch(struct db *db, const struct db_stmt *s,
                                                     size_t rows, const struct param *const *ps,
                                                     size_t n, struct pg_result **outs);
/* db_run_batch's rows as ONE statement (`rows_stmt`): each of its parameters is an array of that
 * parameter's values in every row, in order (`$k::text[]`, or `$k::bytea[]` for a binary one:
 * ints, floats and booleans travel as their text), and its text unnests them WITH ORDINALITY and
 * answers, first column, the ordinal (1-based) of each row it wrote — once at most, and with at
 * least one column after it (a row answering nothing else would read as unanswered). One
 * parse-free execution, one executor start and one commit for the whole batch, where a batch of
 * statements pays each per row. outs[i]: row i's answer without the ordinal, with no row when the statement answered
 * none for it (the caller PQclears each). Its errors are db_run's for rows_stmt — and
 * STORE_EUNAVAIL when a committed statement's answers cannot be handed over (out of memory): the
 * outcome is then as unknown as after a lost connection — and outs[] is then all NULL. On a
 * distributed database (or rows_stmt NULL) it is db_run_batch of `one`: a statement that unnests
 * parameters there is not one shard's; and for one row, where `one` costs less. */
__attribute__((warn_unused_result)) int db_run_rows(struct db *db, const struct db_stmt *rows_stmt,
                                                    const struct db_stmt *one, size_t rows,
                                                    const struct param *const *ps, size_t n,
                                                    struct pg_result **outs);
/* Parameter `name` of every row as a one-dimensional array in PostgreSQL's binary form
 * (array_recv: dimensions, flags, element type, then each element's length and bytes): text[]
 * or, when the rows' values are bytes, bytea[] — db_run_rows's parameters. A p_text_lossy value
 * that is not UTF-8 is put with U+FFFD for its stray bytes (as db_run binds one), logged with
 * s's name. NULL when a row lacks it, the rows disagree on its kind, or memory runs out; the
 * caller frees the array. */
unsigned char *db_rows_array(const struct db_stmt *s, const char *name, size_t rows,
                             const struct param *const *ps, size_t n, size_t *len);
/* db_run for a statement whose answer is one number: DB_ROWS, how many rows it returned or
 * changed; DB_VALUE, the integer in the first column of its first row (STORE_ENOTFOUND when it
 * returned no row). */
enum db_number { DB_ROWS, DB_VALUE };
__attribute__((warn_unused_result)) int db_run_number(struct db *db, const struct db_stmt *s,
                                                      const struct param *ps, size_t n,
                                                      enum db_number what, long long *out);
#define DB_ARGS(...)                                                                               \
    ((const struct param[]){__VA_ARGS__}),                                                         \
        (sizeof((const struct param[]){__VA_ARGS__}) / sizeof(struct param))

/* The text of a result cell, NULL for SQL NULL. */
const char *db_val(const struct pg_result *r, int row, int col);
/* Row `row` of r as a result of its own (the same columns, that row only): the rows of a batch
 * are then worked on, and freed, one by one. NULL when out of memory. */
struct pg_result *db_result_row(const struct pg_result *r, int row);
/* Decodes a bytea in PostgreSQL's hex output format ("\x…") into a new NUL-terminated buffer;
 * NULL in, NULL out. 0 or -1. */
int db_bytea_decode(const char *s, unsigned char **out, size_t *len);

/* Whether a statement that failed with SQLSTATE state did nothing and may be sent again (a
 * retryable 503 store-busy, never a 500): conflicts, deadlocks, lock and statement timeouts. */
int db_sqlstate_retryable(const char *state);

#endif
