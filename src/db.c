#include "idemgate/db.h"

#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/stmthealth.h"
#include "idemgate/utf8.h"

#include <errno.h>
#include <libpq-fe.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* More than store.c and lease.c have; were it ever reached, the connection's statements are
 * deallocated and prepared again as they are used. */
#define DB_MAX_PREPARED 96
#define DB_MAX_PARAMS 32

struct db {
    char *url;
    PGconn *conn;
    int ok;
    unsigned generation; /* +1 on every new connection: LISTEN must then be issued again */
    /* The statements prepared on this connection (forgotten on reconnection). */
    const struct db_stmt *prepared[DB_MAX_PREPARED];
    int n_prepared;
    int distributed; /* the database is a Citus coordinator (db_stmt.sql_distributed) */
    int unreachable; /* the last run could not even connect (db_unreachable) */
};

/* Server notices ("relation already exists, skipping") are not events: drop them. */
static void ignore_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

/* 1 when an idle connection was closed by the server while unused: its socket is readable
 * although nothing was asked (the server's farewell, then end of file). A notification waiting
 * on a LISTEN connection is read into libpq's buffer and kept, and the connection stays. Only an
 * idle connection is judged: inside a transaction a lost connection is the caller's to handle. */
static int idle_conn_closed(PGconn *c)
{
    if (PQtransactionStatus(c) != PQTRANS_IDLE)
        return 0;
    struct pollfd pfd = {.fd = PQsocket(c), .events = POLLIN};
    if (pfd.fd < 0)
        return 1;
    if (poll(&pfd, 1, 0) <= 0)
        return 0;
    return !PQconsumeInput(c) || PQstatus(c) != CONNECTION_OK;
}

int db_read_only_server(const char *in_hot_standby, const char *default_read_only)
{
    return (in_hot_standby && strcmp(in_hot_standby, "on") == 0) ||
           (default_read_only && strcmp(default_read_only, "on") == 0);
}

/* 1 when the server has told this connection that it accepts no writes: a standby, or a
 * primary fenced with default_transaction_read_only (PostgreSQL 14+ reports both when the
 * session starts and again when they change; a pooler that does not pass them on reports
 * nothing, and a refused write, SQLSTATE 25006, says it instead). */
static int conn_read_only(PGconn *c)
{
    return db_read_only_server(PQparameterStatus(c, "in_hot_standby"),
                               PQparameterStatus(c, "default_transaction_read_only"));
}

/* Whether the database is distributed (the citus extension is installed in it): read once per
 * connection. A failed read counts as not distributed; the statements then fail on their own,
 * visibly (stmthealth.h). */
static int conn_distributed(PGconn *c)
{
    PGresult *r = PQexec(c, "SELECT 1 FROM pg_extension WHERE extname = 'citus'");
    int yes = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
    PQclear(r);
    return yes;
}

/* Why a connection failed, for the log. libpq quotes the whole URL when it cannot parse it (a
 * misplaced character, a bad escape), password included: such a URL is named, never quoted. */
static const char *connect_error(const struct db *db)
{
    /* (as libpq's expand_dbname: a URL, or key=value pairs; anything else is a database name) */
    if (!strstr(db->url, "://") && !strchr(db->url, '='))
        return PQerrorMessage(db->conn);
    char *why = NULL;
    PQconninfoOption *o = PQconninfoParse(db->url, &why);
    if (!o) {
        PQfreemem(why);
        return "the database URL is not a valid libpq connection string (its text is not "
               "logged: it may hold a password)";
    }
    PQconninfoFree(o);
    return PQerrorMessage(db->conn);
}

/* A connection to url. Unless the URL says otherwise, a connection attempt gives up after
 * DB_CONNECT_TIMEOUT_S and an established connection is probed by TCP keepalives: without them
 * libpq waits as long as the kernel for an unanswered SYN or a silent peer (minutes), and a
 * thread opening its connection then holds a drain (SIGTERM) that long. Keepalives probe only an
 * idle connection: a statement sent to a peer gone silent waited for the kernel's retransmissions
 * (~15 minutes), so unacknowledged data also ends the connection after the same minute
 * (tcp_user_timeout; waiting for a long statement's answer is not unacknowledged data). The
 * URL's own values win (they come after these). */
#define DB_CONNECT_TIMEOUT_S "10"
static PGconn *db_connect(const char *url)
{
    static const char *const keys[] = {"connect_timeout",     "keepalives",
                                       "keepalives_idle",     "keepalives_interval",
                                       "keepalives_count",    "tcp_user_timeout",
                                       "dbname",              NULL};
    const char *vals[] = {DB_CONNECT_TIMEOUT_S, "1", "30", "10", "3", "60000", url, NULL};
    return PQconnectdbParams(keys, vals, 1);
}


static int connect_db(struct db *db)
{
    if (db->conn && PQstatus(db->conn) == CONNECTION_OK) {
        const char *why = NULL;
        if (idle_conn_closed(db->conn))
            why = "connection closed by the server while idle";
        else if (PQtransactionStatus(db->conn) == PQTRANS_IDLE && conn_read_only(db->conn))
            why = "server no longer accepts writes (fenced or demoted primary)";
        if (!why)
            return STORE_OK;
        /* Nothing was sent on it: replacing it now is safe for any statement. */
        LOG(LOG_INFO, "db_reconnect", LS("reason", why));
    }
    if (db->conn)
        PQfinish(db->conn);
    db->n_prepared = 0;
    db->conn = db_connect(db->url);
    const char *error = PQstatus(db->conn) != CONNECTION_OK ? connect_error(db)
                        : conn_read_only(db->conn)
                            ? "server accepts no writes (a standby or a fenced primary)"
                            : NULL;
    if (error) {
        if (db->ok) /* log the transition, not every retry */
            LOG(LOG_WARN, "db_unavailable", LS("error", error));
        db->ok = 0;
        PQfinish(db->conn);
        db->conn = NULL;
        return STORE_EUNAVAIL;
    }
    PQsetNoticeProcessor(db->conn, ignore_notice, NULL);
    db->distributed = conn_distributed(db->conn);
    db->ok = 1;
    db->generation++;
    return STORE_OK;
}

struct db *store_db_open(const char *url)
{
    struct db *db = calloc(1, sizeof(*db));
    if (!db)
        return NULL;
    db->url = strdup(url);
    if (!db->url) {
        free(db);
        return NULL;
    }
    db->ok = 1;
    (void)connect_db(db);
    return db;
}

void store_db_close(struct db *db)
{
    if (!db)
        return;
    if (db->conn)
        PQfinish(db->conn);
    free(db->url);
    free(db);
}

int store_db_ok(struct db *db)
{
    return db->ok;
}

unsigned store_db_generation(struct db *db)
{
    return db->generation;
}

void *store_db_pgconn(struct db *db)
{
    return db->conn;
}

int store_db_ensure(struct db *db)
{
    return connect_db(db);
}

int store_db_backend_pid(struct db *db)
{
    return db->conn ? PQbackendPID(db->conn) : 0;
}

int db_sqlstate_retryable(const char *state)
{
    /* serialization_failure, deadlock_detected, lock_not_available (lock_timeout),
     * query_canceled (statement_timeout, or an operator's pg_cancel_backend): the statement did
     * not happen; the same request may simply be sent again. */
    static const char *const retryable[] = {"40001", "40P01", "55P03", "57014"};
    for (size_t i = 0; state && i < sizeof(retryable) / sizeof(retryable[0]); i++)
        if (strcmp(state, retryable[i]) == 0)
            return 1;
    return 0;
}

/* Maps a failed result to a store error. Connection failures mark the handle for reconnection. */
static int result_error(struct db *db, PGresult *r, const char *stmt)
{
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    /* 25006: a write refused because the server no longer accepts writes — the primary was
     * fenced or demoted under this session. Like a lost connection, the session is of no more
     * use: dropped, so that the next call finds the primary (target_session_attrs=read-write).
     * The statement is rerun only under db_run's rule (rerun_safe), as for a lost connection. */
    if (!db->conn || PQstatus(db->conn) != CONNECTION_OK || !state ||
        strncmp(state, "08", 2) == 0 || strncmp(state, "57P", 3) == 0 ||
        strcmp(state, "25006") == 0) {
        if (db->ok)
            LOG(LOG_WARN, "db_unavailable", LS("statement", stmt),
                LS("error", db->conn ? PQerrorMessage(db->conn) : "no connection"));
        db->ok = 0;
        if (db->conn) {
            PQfinish(db->conn);
            db->conn = NULL;
        }
        return STORE_EUNAVAIL;
    }
    if (db_sqlstate_retryable(state))
        return STORE_ERETRY;
    if (strcmp(state, "23505") == 0)
        return STORE_ECONFLICT;
    /* The primary message only: PostgreSQL's DETAIL can quote the failing row (a request's
     * body, its prompt, in hex) and its CONTEXT the JSON given. */
    const char *primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    LOG(LOG_ERROR, "db_error", LS("statement", stmt), LS("sqlstate", state),
        LS("error", primary ? primary : "(no message)"));
    sh_failed(stmt, state);
    return STORE_EINTERNAL;
}

/* Prepares s on this connection unless it already is. The schema may not exist yet (before
 * `migrate`): the failure is then reported for this call and the next call prepares again. */
static int prepare(struct db *db, const struct db_stmt *s)
{
    for (int i = 0; i < db->n_prepared; i++)
        if (db->prepared[i] == s)
            return STORE_OK;
    if (db->n_prepared == DB_MAX_PREPARED) {
        PQclear(PQexec(db->conn, "DEALLOCATE ALL"));
        db->n_prepared = 0;
    }
    const char *sql = db->distributed && s->sql_distributed ? s->sql_distributed : s->sql;
    PGresult *r = PQprepare(db->conn, s->name, sql, 0, NULL);
    int e = PQresultStatus(r) == PGRES_COMMAND_OK ? STORE_OK : result_error(db, r, s->name);
    PQclear(r);
    if (e == STORE_OK)
        db->prepared[db->n_prepared++] = s;
    return e;
}

static void forget(struct db *db, const struct db_stmt *s)
{
    for (int i = 0; i < db->n_prepared; i++)
        if (db->prepared[i] == s)
            db->prepared[i] = db->prepared[--db->n_prepared];
}

/* A diagnostic text parameter (p_text_lossy) that is not UTF-8 (a header in Latin-1, a provider's
 * message in raw bytes) would be refused by a UTF8 database with 22021 — a result's write refused
 * for ever over one diagnostic field, its job never ending. Such a value is bound with every byte
 * that starts no sequence as U+FFFD (a copy in owned[pos], freed by unbind). Any other text (an
 * id, a key, a URL) is bound as it is: changed, it would name something else silently; refused,
 * the write fails where it can be seen. Binary parameters (bytea: bodies) are bytes. */
static int repair_text(const struct db_stmt *s, const char *name, const char **val, char **owned)
{
    if (utf8_valid(*val, strlen(*val)))
        return 0;
    char *fixed = utf8_repair(*val);
    if (!fixed)
        return -1;
    LOG(LOG_WARN, "db_text_repaired", LS("statement", s->name), LS("param", name),
        LS("note", "not UTF-8: its stray bytes are bound as U+FFFD"));
    *owned = fixed;
    *val = fixed;
    return 0;
}

static void unbind(char **owned, int k)
{
    for (int i = 0; i < k; i++) {
        free(owned[i]);
        owned[i] = NULL;
    }
}

/* Puts each parameter at the position s->params gives its name. -1 when a name is unknown, bound
 * twice, or missing. */
static int bind(const struct db_stmt *s, const struct param *ps, size_t n, const char **vals,
                int *lens, int *fmts, int *count, char **owned)
{
    int k = 0;
    while (s->params && s->params[k])
        k++;
    if ((size_t)k != n || k > DB_MAX_PARAMS)
        return -1;
    int seen[DB_MAX_PARAMS] = {0};
    for (size_t i = 0; i < n; i++) {
        int pos = 0;
        while (pos < k && strcmp(s->params[pos], ps[i].name) != 0)
            pos++;
        if (pos == k || seen[pos]++)
            return -1;
        vals[pos] = ps[i].is_num ? ps[i].num : ps[i].value;
        lens[pos] = ps[i].len;
        fmts[pos] = ps[i].binary;
        if (ps[i].lossy && vals[pos] && repair_text(s, ps[i].name, &vals[pos], &owned[pos]) < 0)
            return -1;
    }
    *count = k;
    return 0;
}

/* How far one run got: what a lost connection may have left behind. */
enum run_stage {
    RUN_UNCONNECTED, /* no connection could be made */
    RUN_CONNECTED,   /* connected; at most a PREPARE was sent, which changes nothing */
    RUN_SENT,        /* the statement itself may have reached the server */
};

/* One run of a bound statement; *stage says how far it got. */
static int run_once(struct db *db, const struct db_stmt *s, int k, const char *const *vals,
                    const int *lens, const int *fmts, struct pg_result **out, enum run_stage *stage)
{
    *stage = RUN_UNCONNECTED;
    db->unreachable = connect_db(db) < 0;
    if (db->unreachable)
        return STORE_EUNAVAIL;
    *stage = RUN_CONNECTED;
    int e = prepare(db, s);
    if (e < 0)
        return e;
    *stage = RUN_SENT;
    PGresult *r = PQexecPrepared(db->conn, s->name, k, vals, lens, fmts, 0);
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    if (state && strcmp(state, "26000") == 0) {
        /* The server lost the statement (DISCARD ALL behind a pooler): prepare and run again. */
        PQclear(r);
        forget(db, s);
        if ((e = prepare(db, s)) < 0)
            return e;
        r = PQexecPrepared(db->conn, s->name, k, vals, lens, fmts, 0);
    }
    ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        e = result_error(db, r, s->name);
        PQclear(r);
        return e;
    }
    if (conn_read_only(db->conn)) {
        /* The server said, with this answer, that it accepts no more writes: it turned read-only
         * (a fenced or demoted primary) before running the statement, so nothing was written and
         * the answer may be stale — the primary is elsewhere now. Handled like a connection lost
         * with the statement in flight: the session is dropped and the statement rerun only when
         * rerun_safe. */
        PQclear(r);
        LOG(LOG_WARN, "db_unavailable", LS("statement", s->name),
            LS("error", "server no longer accepts writes (fenced or demoted primary)"));
        db->ok = 0;
        PQfinish(db->conn);
        db->conn = NULL;
        return STORE_EUNAVAIL;
    }
    db->ok = 1;
    sh_ok(s->name);
    *out = r;
    return STORE_OK;
}

int db_run(struct db *db, const struct db_stmt *s, const struct param *ps, size_t n,
           struct pg_result **out)
{
    const char *vals[DB_MAX_PARAMS];
    int lens[DB_MAX_PARAMS], fmts[DB_MAX_PARAMS], k = 0;
    enum run_stage stage;
    *out = NULL;
    char *owned[DB_MAX_PARAMS] = {0};
    if (bind(s, ps, n, vals, lens, fmts, &k, owned) < 0) {
        unbind(owned, DB_MAX_PARAMS);
        LOG(LOG_ERROR, "db_error", LS("statement", s->name),
            LS("error", "parameters do not match"));
        return STORE_EINTERNAL;
    }
    int e = run_once(db, s, k, vals, lens, fmts, out, &stage);
    /* The connection was lost under the call (result_error dropped it): once more on a new one
     * when nothing of the statement ran or when running it twice is harmless. A database still
     * down fails the new connection at once; one that could not be reached at all is not tried
     * twice. */
    if (e == STORE_EUNAVAIL && stage != RUN_UNCONNECTED && !db->conn &&
        (stage == RUN_CONNECTED || s->rerun_safe)) {
        LOG(LOG_INFO, "db_rerun", LS("statement", s->name),
            LS("reason", stage == RUN_SENT ? "connection lost, statement rerun_safe"
                                           : "connection lost before the statement was sent"));
        e = run_once(db, s, k, vals, lens, fmts, out, &stage);
    }
    unbind(owned, DB_MAX_PARAMS);
    return e;
}

/* ---- Batches: many executions, one transaction, one round trip (libpq pipeline mode) ---- */

/* Flushes what libpq holds for the server, reading the server's answers meanwhile: neither side
 * can then block on a full socket buffer however large the batch. Non-blocking connection. */
static int pipeline_flush(PGconn *c)
{
    for (;;) {
        int f = PQflush(c);
        if (f <= 0)
            return f;
        struct pollfd pfd = {.fd = PQsocket(c), .events = POLLIN | POLLOUT};
        if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
            return -1;
        if ((pfd.revents & (POLLIN | POLLERR | POLLHUP)) && !PQconsumeInput(c))
            return -1;
    }
}

/* Queues BEGIN, the rows' executions and COMMIT, then the sync point. 0 or -1. */
static int batch_send(struct db *db, const struct db_stmt *s, size_t rows,
                      const struct param *const *ps, size_t n)
{
    const char *vals[DB_MAX_PARAMS];
    int lens[DB_MAX_PARAMS], fmts[DB_MAX_PARAMS], k = 0;
    if (!PQsendQueryParams(db->conn, "BEGIN", 0, NULL, NULL, NULL, NULL, 0))
        return -1;
    for (size_t i = 0; i < rows; i++) {
        char *owned[DB_MAX_PARAMS] = {0};
        int ok = bind(s, ps[i], n, vals, lens, fmts, &k, owned) == 0 &&
                 PQsendQueryPrepared(db->conn, s->name, k, vals, lens, fmts, 0);
        unbind(owned, DB_MAX_PARAMS); /* libpq has copied the values into its buffer */
        if (!ok)
            return -1;
    }
    if (!PQsendQueryParams(db->conn, "COMMIT", 0, NULL, NULL, NULL, NULL, 0) ||
        !PQpipelineSync(db->conn))
        return -1;
    return pipeline_flush(db->conn);
}

/* Reads the results up to the sync point: outs[i] for row i; the first error met (later commands
 * of the pipeline are then aborted, and the transaction with them). */
static int batch_read(struct db *db, const struct db_stmt *s, size_t rows, struct pg_result **outs)
{
    int e = STORE_OK, nulls = 0;
    size_t cmd = 0; /* 0: BEGIN, 1..rows: the rows, rows + 1: COMMIT */
    for (;;) {
        PGresult *r = PQgetResult(db->conn);
        if (!r) {
            if (++nulls > 1 || PQstatus(db->conn) != CONNECTION_OK)
                return result_error(db, NULL, s->name); /* the connection went away */
            continue;
        }
        nulls = 0;
        ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_PIPELINE_SYNC) {
            PQclear(r);
            return cmd == rows + 2 ? e : result_error(db, NULL, s->name);
        }
        if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK && e == STORE_OK)
            e = st == PGRES_PIPELINE_ABORTED ? STORE_ERETRY : result_error(db, r, s->name);
        if (cmd >= 1 && cmd <= rows && e == STORE_OK)
            outs[cmd - 1] = r;
        else
            PQclear(r);
        cmd++;
        if (!db->conn)
            return e; /* result_error dropped the connection */
    }
}

int db_run_batch(struct db *db, const struct db_stmt *s, size_t rows, const struct param *const *ps,
                 size_t n, struct pg_result **outs)
{
    for (size_t i = 0; i < rows; i++)
        outs[i] = NULL;
    if (connect_db(db) < 0)
        return STORE_EUNAVAIL;
    int e = prepare(db, s);
    if (e < 0)
        return e;
    if (!PQenterPipelineMode(db->conn) || PQsetnonblocking(db->conn, 1) != 0)
        return result_error(db, NULL, s->name);
    if (batch_send(db, s, rows, ps, n) < 0)
        e = result_error(db, NULL, s->name);
    else if (PQsetnonblocking(db->conn, 0) != 0)
        e = result_error(db, NULL, s->name);
    else
        e = batch_read(db, s, rows, outs);
    if (db->conn && (PQsetnonblocking(db->conn, 0) != 0 || !PQexitPipelineMode(db->conn)))
        e = result_error(db, NULL, s->name); /* a connection in an unknown mode is not reused */
    /* An error inside BEGIN … COMMIT leaves the transaction aborted past the sync point: end it,
     * or every later statement on this connection would be refused. */
    if (db->conn && PQtransactionStatus(db->conn) != PQTRANS_IDLE) {
        PGresult *rb = PQexec(db->conn, "ROLLBACK");
        if (PQresultStatus(rb) != PGRES_COMMAND_OK)
            e = result_error(db, rb, s->name);
        PQclear(rb);
    }
    if (e < 0) {
        for (size_t i = 0; i < rows; i++) {
            PQclear(outs[i]);
            outs[i] = NULL;
        }
        return e;
    }
    db->ok = 1;
    sh_ok(s->name);
    return STORE_OK;
}

/* Big-endian 32-bit, into a growing buffer. */
static void put32(unsigned char *b, size_t *at, unsigned v)
{
    b[(*at)++] = (unsigned char)(v >> 24);
    b[(*at)++] = (unsigned char)(v >> 16);
    b[(*at)++] = (unsigned char)(v >> 8);
    b[(*at)++] = (unsigned char)v;
}

/* The parameter of one row named `name`, or NULL when it has none. */
/* Parameter `name` of a row: at `hint` (where the batch's first row has it: rows are built by
 * the same code, so the same place and most often the same string) before any search. The
 * search of every parameter of every row by name was ~1 % of the gateway's CPU under load. */
static const struct param *row_param(const struct param *row, size_t n, const char *name,
                                     size_t hint)
{
    if (hint < n && (row[hint].name == name || strcmp(row[hint].name, name) == 0))
        return &row[hint];
    for (size_t i = 0; i < n; i++)
        if (strcmp(row[i].name, name) == 0)
            return &row[i];
    return NULL;
}

unsigned char *db_rows_array(const struct db_stmt *s, const char *name, size_t rows,
                             const struct param *const *ps, size_t n, size_t *len)
{
    /* A diagnostic text (p_text_lossy) that is not UTF-8 is bound with U+FFFD, as bind does for
     * one row: one such value would otherwise fail the whole batch (22021), every row then
     * written again one by one. */
    char **fixed = calloc(rows ? rows : 1, sizeof(*fixed));
    unsigned char *b = NULL;
    size_t need = 20;
    int binary = -1;
    if (!fixed)
        return NULL;
    const struct param *first = rows ? row_param(ps[0], n, name, n) : NULL;
    size_t hint = first ? (size_t)(first - ps[0]) : n;
    for (size_t i = 0; i < rows; i++) {
        const struct param *p = row_param(ps[i], n, name, hint);
        if (!p || (binary >= 0 && binary != p->binary))
            goto out;
        binary = p->binary;
        const char *v = p->is_num ? p->num : p->value;
        if (v && p->lossy && !p->binary && repair_text(s, name, &v, &fixed[i]) < 0)
            goto out;
        need += 4 + (v ? (p->binary ? (size_t)p->len : strlen(v)) : 0);
    }
    if (!(b = malloc(need)))
        goto out;
    size_t at = 0;
    put32(b, &at, 1);                     /* dimensions */
    put32(b, &at, 1);                     /* may hold NULLs */
    put32(b, &at, binary == 1 ? 17 : 25); /* bytea, text */
    put32(b, &at, (unsigned)rows);
    put32(b, &at, 1); /* lower bound */
    for (size_t i = 0; i < rows; i++) {
        const struct param *p = row_param(ps[i], n, name, hint);
        const char *v = fixed[i] ? fixed[i] : p->is_num ? p->num : p->value;
        if (!v) {
            put32(b, &at, 0xffffffffu);
            continue;
        }
        size_t l = p->binary ? (size_t)p->len : strlen(v);
        put32(b, &at, (unsigned)l);
        memcpy(b + at, v, l);
        at += l;
    }
    *len = at;
out:
    for (size_t i = 0; i < rows; i++)
        free(fixed[i]);
    free(fixed);
    return b;
}

/* Row `row` of r without its first column (the ordinal), as a result of its own. */
static PGresult *answer_row(const PGresult *r, int row)
{
    int nf = PQnfields(r) - 1;
    PGresult *one = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    PGresAttDesc *atts = nf > 0 ? calloc((size_t)nf, sizeof(*atts)) : NULL;
    if (!one || (nf > 0 && !atts)) {
        free(atts);
        PQclear(one);
        return NULL;
    }
    for (int c = 0; c < nf; c++)
        atts[c] = (PGresAttDesc){.name = PQfname(r, c + 1),
                                 .typid = PQftype(r, c + 1),
                                 .typlen = PQfsize(r, c + 1),
                                 .atttypmod = PQfmod(r, c + 1)};
    int ok = PQsetResultAttrs(one, nf, atts);
    free(atts);
    for (int c = 0; ok && row >= 0 && c < nf; c++) {
        int null = PQgetisnull(r, row, c + 1);
        ok = PQsetvalue(one, 0, c, null ? NULL : PQgetvalue(r, row, c + 1),
                        null ? -1 : PQgetlength(r, row, c + 1));
    }
    if (!ok) {
        PQclear(one);
        return NULL;
    }
    return one;
}

int db_run_rows(struct db *db, const struct db_stmt *rows_stmt, const struct db_stmt *one,
                size_t rows, const struct param *const *ps, size_t n, struct pg_result **outs)
{
    for (size_t i = 0; i < rows; i++)
        outs[i] = NULL;
    if (connect_db(db) < 0)
        return STORE_EUNAVAIL;
    /* One row on a distributed database: the statement alone, in its own transaction — a
     * function call inside an explicit one is not delegated to the tenant's worker (Citus's
     * force_delegation, which a batch spanning tenants cannot have), and runs its statements
     * from the coordinator, a round trip each. */
    if (rows == 1 && db->distributed)
        return db_run(db, one, ps[0], n, &outs[0]);
    /* One row: the single statement (in a batch of one) is the lighter of the two. */
    if (!rows_stmt || db->distributed || rows < 2)
        return db_run_batch(db, one, rows, ps, n, outs);
    if (n > DB_MAX_PARAMS)
        return STORE_EINTERNAL;
    struct param arrays[DB_MAX_PARAMS];
    unsigned char *bufs[DB_MAX_PARAMS] = {0};
    int e = STORE_OK;
    for (size_t k = 0; k < n && e == STORE_OK; k++) {
        size_t len = 0;
        bufs[k] = db_rows_array(rows_stmt, ps[0][k].name, rows, ps, n, &len);
        if (!bufs[k])
            e = STORE_EINTERNAL;
        else
            arrays[k] = p_bytes(ps[0][k].name, bufs[k], len);
    }
    PGresult *r = NULL;
    if (e == STORE_OK)
        e = db_run(db, rows_stmt, arrays, n, &r);
    for (size_t k = 0; k < n; k++)
        free(bufs[k]);
    if (e < 0) {
        metrics_db_rows(rows_stmt->name, 0, 0, rows);
        return e;
    }
    /* Committed from here on: answers that cannot be handed over are as a connection lost
     * after the commit (STORE_EUNAVAIL, the outcome unknown), never as nothing written. */
    int *at = malloc(rows * sizeof(*at));
    if (!at) {
        PQclear(r);
        return STORE_EUNAVAIL;
    }
    for (size_t i = 0; i < rows; i++)
        at[i] = -1;
    for (int t = 0; t < PQntuples(r); t++) {
        long long ord = atoll(PQgetvalue(r, t, 0));
        if (ord >= 1 && (size_t)ord <= rows)
            at[ord - 1] = t;
    }
    size_t answered = 0;
    for (size_t i = 0; i < rows && e == STORE_OK; i++) {
        answered += at[i] >= 0;
        if (!(outs[i] = answer_row(r, at[i])))
            e = STORE_EUNAVAIL;
    }
    metrics_db_rows(rows_stmt->name, answered, rows - answered, 0);
    free(at);
    PQclear(r);
    if (e < 0)
        for (size_t i = 0; i < rows; i++) {
            PQclear(outs[i]);
            outs[i] = NULL;
        }
    return e;
}

int db_run_number(struct db *db, const struct db_stmt *s, const struct param *ps, size_t n,
                  enum db_number what, long long *out)
{
    PGresult *r;
    int e = db_run(db, s, ps, n, &r);
    if (e < 0)
        return e;
    if (what == DB_ROWS)
        *out = atoll(PQcmdTuples(r));
    else if (PQntuples(r) > 0)
        *out = atoll(PQgetvalue(r, 0, 0));
    else
        e = STORE_ENOTFOUND;
    PQclear(r);
    return e;
}

int db_stmt_moves(const struct db_stmt *s, int from, enum op_state to)
{
    for (const struct db_move *m = s->moves; m && m->from >= 0; m++)
        if (m->from == from && m->to == to)
            return 1;
    return 0;
}

struct param p_text(const char *name, const char *value)
{
    return (struct param){.name = name, .value = value};
}

struct param p_text_lossy(const char *name, const char *value)
{
    return (struct param){.name = name, .value = value, .lossy = 1};
}

struct param p_bytes(const char *name, const void *value, size_t len)
{
    return (struct param){.name = name, .value = value, .len = (int)len, .binary = 1};
}

struct param p_int(const char *name, long long value)
{
    struct param p = {.name = name, .is_num = 1};
    snprintf(p.num, sizeof(p.num), "%lld", value);
    return p;
}

struct param p_float(const char *name, double value)
{
    struct param p = {.name = name, .is_num = 1};
    snprintf(p.num, sizeof(p.num), "%.6f", value);
    return p;
}

struct param p_bool(const char *name, int value)
{
    return p_text(name, value ? "t" : "f");
}

struct param p_null(const char *name)
{
    return p_text(name, NULL);
}

int db_unreachable(const struct db *db)
{
    return db->unreachable;
}

int db_connected(const struct db *db)
{
    return db->conn && PQstatus(db->conn) == CONNECTION_OK;
}

const char *db_val(const struct pg_result *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? NULL : PQgetvalue(r, row, col);
}

PGresult *db_result_row(const PGresult *r, int row)
{
    PGresult *one = PQcopyResult(r, PG_COPYRES_ATTRS);
    if (!one)
        return NULL;
    for (int c = 0; c < PQnfields(r); c++) {
        int null = PQgetisnull(r, row, c);
        if (!PQsetvalue(one, 0, c, null ? NULL : PQgetvalue(r, row, c),
                        null ? -1 : PQgetlength(r, row, c))) {
            PQclear(one);
            return NULL;
        }
    }
    return one;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int db_bytea_decode(const char *s, unsigned char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    if (!s)
        return 0;
    if (s[0] != '\\' || s[1] != 'x')
        return -1;
    size_t n = strlen(s + 2) / 2;
    unsigned char *b = malloc(n + 1);
    if (!b)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(s[2 + 2 * i]), lo = hexval(s[3 + 2 * i]);
        if (hi < 0 || lo < 0) {
            free(b);
            return -1;
        }
        b[i] = (unsigned char)(hi << 4 | lo);
    }
    b[n] = '\0';
    *out = b;
    *len = n;
    return 0;
}

/* Hands every buffered notification to cb; returns how many. */
static int drain_notifies(struct db *db, void (*cb)(const char *, int, void *), void *arg)
{
    int n = 0;
    PGnotify *nt;
    while ((nt = PQnotifies(db->conn))) {
        cb(nt->extra, nt->be_pid, arg);
        PQfreemem(nt);
        n++;
    }
    return n;
}

int store_listen(struct db *db, const char *channel)
{
    if (connect_db(db) < 0)
        return STORE_EUNAVAIL;
    char sql[128];
    snprintf(sql, sizeof(sql), "LISTEN %s", channel);
    PGresult *r = PQexec(db->conn, sql);
    int e = PQresultStatus(r) == PGRES_COMMAND_OK ? STORE_OK : result_error(db, r, "listen");
    PQclear(r);
    return e;
}

int store_wait_notify(struct db *db, int timeout_ms, const int *wake_fds, int n_wake,
                      void (*cb)(const char *, int, void *), void *arg)
{
    if (!db->conn)
        return STORE_EUNAVAIL;
    /* Notifications may already be buffered from an earlier call. */
    if (PQconsumeInput(db->conn) == 0)
        return result_error(db, NULL, "notify");
    int n = drain_notifies(db, cb, arg);
    if (n > 0)
        return n;
    struct pollfd pfd[1 + DB_MAX_WAKE_FDS] = {{.fd = PQsocket(db->conn), .events = POLLIN}};
    int n_pfd = 1;
    for (int i = 0; i < n_wake && i < DB_MAX_WAKE_FDS; i++)
        if (wake_fds[i] >= 0)
            pfd[n_pfd++] = (struct pollfd){.fd = wake_fds[i], .events = POLLIN};
    if (pfd[0].fd < 0)
        return result_error(db, NULL, "notify");
    if (poll(pfd, (nfds_t)n_pfd, timeout_ms) <= 0 || !(pfd[0].revents & POLLIN))
        return 0;
    if (PQconsumeInput(db->conn) == 0)
        return result_error(db, NULL, "notify");
    return drain_notifies(db, cb, arg);
}
