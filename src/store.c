#include "idemgate/store.h"

#include "idemgate/clock.h"
#include "idemgate/jobpage.h"
#include "idemgate/log.h"
#include "idemgate/turns.h"
#include "idemgate/wake.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Tenant-scoped reads and writes (intake, jobs, cancel, resolve, regenerate, webhooks), tenants,
 * breakers, gauges and the operator's reads. Each statement stands beside the function that runs
 * it; the connection, preparation and parameter binding are db.c's; what workers write under a
 * lease is lease.c's. A function whose committed write leaves an operation prepared, completed
 * or failed says so to wake.h (the intake's caller does, for a created job). */

/* The projection of a job, identical for every statement that returns one so that one reader
 * (job_from_row) serves them all. */
/* An operator's read formats its timestamps in SQL; a job's come as Unix seconds (exact: numeric
 * with six decimals), formatted by job_from_row (store_stamp_epoch): to_char costs five times
 * as much, on every job read. */
#define TS(a, c) "to_char(" a "." c " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
#define EPOCH(a, c) "extract(epoch FROM " a "." c ")"
/* A job lives job_ttl_hours after it was recorded (expires_at, set at intake and at a
 * regenerate) and as long again after it ended: a job that ends after its ttl — in review for
 * days, then resolved; a task the provider runs for longer than the ttl — keeps its key that
 * long, or the janitor deleted it at once and a retry under its key paid again. The ttl is the
 * row's own (expires_at − created_at), so no setting is read here and no writer moves it. */
#define JOB_EXPIRY(a)                                                                              \
    "greatest(" a ".expires_at, " a ".finished_at + (" a ".expires_at - " a ".created_at))"
#define JOB_COLS(a)                                                                                \
    a ".tenant_id, " a ".id, " a ".idempotency_key, encode(" a ".fingerprint, 'hex'), " a          \
      ".provider, " a ".route, " a ".state, " a ".lease_version, " a ".transport_attempts, " a     \
      ".generation_attempts, " a ".parent_id, " a ".remote_id, " a ".resp_status, " a              \
      ".resp_headers, " a ".resp_body, " a ".last_error, " EPOCH(a, "created_at") ", "            \
      EPOCH(a, "updated_at") ", " EPOCH(a, "first_sent_at") ", " EPOCH(a, "finished_at") ", "     \
      "extract(epoch FROM " JOB_EXPIRY(a) "), " a ".outputs_requested, " a ".outputs_received, "  \
      a ".usage, " a ".resolution, " a ".resolved_by, " EPOCH(a, "resolved_at") ", " a            \
      ".reconcile_strategy, "                                                                      \
      "(SELECT b.reason FROM provider_breakers b WHERE b.provider = " a ".provider), " a         \
      ".provider_status, " a ".outputs, " EPOCH(a, "cancel_requested_at") ", " a ".profile_id, " a   \
      ".polls, " a ".currency, " a ".reserved_micros, " a ".cost_micros"
/* The columns of a job row, after the leading flag column every job statement returns. */
enum {
    JC_FLAG, JC_TENANT, JC_ID, JC_KEY, JC_FP, JC_PROVIDER, JC_ROUTE, JC_STATE, JC_LEASE_VERSION,
    JC_TRANSPORT, JC_GENERATION, JC_PARENT, JC_REMOTE, JC_RESP_STATUS, JC_RESP_HEADERS,
    JC_RESP_BODY, JC_LAST_ERROR, JC_CREATED, JC_UPDATED, JC_FIRST_SENT, JC_FINISHED, JC_EXPIRES,
    JC_OUT_REQ, JC_OUT_RECV, JC_USAGE, JC_RESOLUTION, JC_RESOLVED_BY, JC_RESOLVED_AT, JC_STRATEGY,
    JC_BLOCKED, JC_PROVIDER_STATUS, JC_OUTPUTS, JC_CANCEL_REQ, JC_PROFILE, JC_POLLS, JC_CURRENCY,
    JC_RESERVED, JC_COST, JC__COUNT
};

static int int_or(const PGresult *r, int row, int col, int absent)
{
    const char *v = db_val(r, row, col);
    return v ? atoi(v) : absent;
}

int store_stamp_epoch(const char *epoch, char out[STORE_STAMP_LEN])
{
    const char *p = epoch;
    long long sec = 0;
    long usec = 0;
    int neg = *p == '-', digits = 0;
    p += neg;
    for (; *p >= '0' && *p <= '9' && digits < 15; p++, digits++)
        sec = sec * 10 + (*p - '0');
    if (!digits)
        return -1;
    if (*p == '.') {
        int k = 0;
        for (p++; *p >= '0' && *p <= '9'; p++, k++)
            if (k < 6)
                usec = usec * 10 + (*p - '0');
        for (; k < 6; k++)
            usec *= 10;
    }
    if (*p)
        return -1;
    if (neg) { /* -1.25 is 1.25 s before the epoch: second -2, 750000 µs */
        sec = -sec - (usec > 0);
        usec = usec > 0 ? 1000000 - usec : 0;
    }
    store_stamp(sec, usec, out);
    return 0;
}

/* The timestamp in column col (Unix seconds, EPOCH), formatted into the job's next stamp slot;
 * NULL when it is NULL (or not a number). */
static const char *stamp_of(struct store_job *j, PGresult *r, int row, int col)
{
    const char *v = db_val(r, row, col);
    if (!v || j->n_stamps >= STORE_JOB_STAMPS)
        return NULL;
    if (!j->stamps && !(j->stamps = malloc(STORE_JOB_STAMPS * sizeof(*j->stamps))))
        return NULL;
    char *out = j->stamps[j->n_stamps];
    if (store_stamp_epoch(v, out) < 0)
        return NULL;
    j->n_stamps++;
    return out;
}

/* Fills j from row `row` of r (JC_ columns). With own set, j takes ownership of r
 * (store_job_fini frees it); otherwise r must outlive j. */
static int job_from_row(PGresult *r, int row, int own, struct store_job *j)
{
    memset(j, 0, sizeof(*j));
    j->res = own ? r : NULL;
    j->tenant_id = atoll(PQgetvalue(r, row, JC_TENANT));
    j->id = db_val(r, row, JC_ID);
    j->idempotency_key = db_val(r, row, JC_KEY);
    j->fingerprint_hex = db_val(r, row, JC_FP);
    j->provider = db_val(r, row, JC_PROVIDER);
    j->route = db_val(r, row, JC_ROUTE);
    const char *st = db_val(r, row, JC_STATE);
    int s = st ? st_parse(st) : -1;
    j->state = s < 0 ? ST_UNKNOWN : (enum op_state)s;
    j->lease_version = atoll(PQgetvalue(r, row, JC_LEASE_VERSION));
    j->transport_attempts = atoi(PQgetvalue(r, row, JC_TRANSPORT));
    j->generation_attempts = atoi(PQgetvalue(r, row, JC_GENERATION));
    j->parent_id = db_val(r, row, JC_PARENT);
    j->remote_id = db_val(r, row, JC_REMOTE);
    j->resp_status = atoi(PQgetvalue(r, row, JC_RESP_STATUS));
    j->resp_headers = db_val(r, row, JC_RESP_HEADERS);
    j->last_error = db_val(r, row, JC_LAST_ERROR);
    j->created_at = stamp_of(j, r, row, JC_CREATED);
    j->updated_at = stamp_of(j, r, row, JC_UPDATED);
    j->first_sent_at = stamp_of(j, r, row, JC_FIRST_SENT);
    j->finished_at = stamp_of(j, r, row, JC_FINISHED);
    j->expires_at = stamp_of(j, r, row, JC_EXPIRES);
    j->outputs_requested = int_or(r, row, JC_OUT_REQ, -1);
    j->outputs_received = int_or(r, row, JC_OUT_RECV, -1);
    j->usage = db_val(r, row, JC_USAGE);
    j->resolution = db_val(r, row, JC_RESOLUTION);
    j->resolved_by = db_val(r, row, JC_RESOLVED_BY);
    j->resolved_at = stamp_of(j, r, row, JC_RESOLVED_AT);
    j->reconcile_strategy = db_val(r, row, JC_STRATEGY);
    j->blocked_reason = db_val(r, row, JC_BLOCKED);
    j->provider_status = db_val(r, row, JC_PROVIDER_STATUS);
    j->outputs = db_val(r, row, JC_OUTPUTS);
    j->cancel_requested_at = stamp_of(j, r, row, JC_CANCEL_REQ);
    j->profile_id = db_val(r, row, JC_PROFILE);
    j->polls = atoi(PQgetvalue(r, row, JC_POLLS));
    j->currency = db_val(r, row, JC_CURRENCY);
    j->reserved_micros = atoll(PQgetvalue(r, row, JC_RESERVED));
    j->cost_micros = db_val(r, row, JC_COST) ? atoll(db_val(r, row, JC_COST)) : -1;
    j->tenant = PQnfields(r) > JC__COUNT ? db_val(r, row, JC__COUNT) : NULL; /* operator reads */
    if (db_bytea_decode(db_val(r, row, JC_RESP_BODY), &j->resp_body, &j->resp_body_len) < 0) {
        store_job_fini(j);
        return STORE_EINTERNAL;
    }
    return STORE_OK;
}

void store_job_fini(struct store_job *j)
{
    PQclear(j->res);
    free(j->resp_body);
    free(j->archive);
    free(j->own);
    free(j->stamps);
    memset(j, 0, sizeof(*j));
}

/* Runs a statement returning (flag, JOB_COLS) rows for one job. With no row: STORE_ENOTFOUND.
 * Otherwise *flag (when given) is the first column and out holds the job. */
static int one_job(struct db *db, const struct db_stmt *s, const struct param *ps, size_t n,
                   struct store_job *out, int *flag)
{
    PGresult *r;
    int e = db_run(db, s, ps, n, &r);
    if (e < 0)
        return e;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return STORE_ENOTFOUND;
    }
    if (flag)
        *flag = atoi(PQgetvalue(r, 0, JC_FLAG));
    if (flag && *flag >= 2) { /* an intake refused by the budget: no job */
        PQclear(r);
        memset(out, 0, sizeof(*out));
        return STORE_OK;
    }
    return job_from_row(r, 0, 1, out);
}

/* A tenant's job by key (the read after an intake that found the key taken) or by id. */
static const struct db_stmt by_key = {
    .rerun_safe = 1,
    .name = "by_key",
    .sql = "SELECT 0, " JOB_COLS("o") " FROM operations o "
    "WHERE o.tenant_id = $1 AND o.idempotency_key = $2",
    .params = DB_PARAMS("tenant_id", "key"),
};
static const struct db_stmt job_get = {
    .rerun_safe = 1,
    .name = "job_get",
    .sql = "SELECT 0, " JOB_COLS("o") " FROM operations o WHERE o.tenant_id = $1 AND o.id = $2",
    .params = DB_PARAMS("tenant_id", "job_id"),
};

/* A tenant's job by key or id: STORE_ENOTFOUND without it. */
static int read_by(struct db *db, const struct db_stmt *s, long long tenant_id,
                   struct param which, struct store_job *out)
{
    return one_job(db, s, DB_ARGS(p_int("tenant_id", tenant_id), which), out, NULL);
}

#define INTAKE_FUNCTION_SQL                                                                     \
    "SELECT idemgate_intake($1::bigint, $2::text, $3::text, $4::text, $5::smallint, "          \
    "$6::text, $7::text, $8::text, $9::text, $10::text, $11::bytea, $12::integer, $13::text, " \
    "$14::text, $15::integer, $16::text, $17::text, $18::integer, $19::bigint, $20::text, "    \
    "$21::boolean, $22::timestamptz)"
#define INTAKE_PARAMS                                                                          \
    DB_PARAMS("tenant_id", "key", "new_id", "fingerprint", "fingerprint_version", "provider",   \
              "route", "method", "url", "credential", "body", "ttl_hours", "idem_header",       \
              "reconcile_strategy", "outputs_requested", "profile_id", "claim_owner",          \
              "lease_seconds", "reserve_micros", "currency", "unpriced", "at")

/* Intake: one call of the per-tenant function idemgate_intake (migrations/0014), which says
 * only what the gateway cannot know — inserted, reserved for the claim owner ($17), the key taken,
 * or refused by the tenant's budget — so the new job is made here from the request itself and a
 * row is read only when the key was taken. */
static const struct db_stmt intake = {
    .name = "intake",
    .sql = INTAKE_FUNCTION_SQL,
    .params = INTAKE_PARAMS,
    .moves = DB_MOVES({DB_NEW_ROW, ST_PREPARED}),
};

#define INTAKE_INSERT                                                                          \
    "INSERT INTO operations (tenant_id, id, idempotency_key, fingerprint, fingerprint_version, "  \
    "provider, route, req_method, req_url, req_credential, req_body, state, created_at, "         \
    "updated_at, expires_at, req_idem_header, reconcile_strategy, outputs_requested, "            \
    "profile_id, lease_owner, lease_version, lease_expires_at, next_attempt_at, reserved_micros, " \
    "currency, budgeted, unpriced) "

/* The group commit's intake: the function's common case as one plain INSERT — a tenant with no
 * budget row, a provider whose breaker is closed, a key not taken nor under a tombstone (its job
 * deleted by retention, migration 0032) — answering as the function
 * does ('2' reserved for the claim owner, '1' not). Any other case inserts nothing and answers
 * no row, and the function decides that request alone (batch_row). A PL/pgSQL call costs ~30 µs
 * of executor time more than the statement it runs (measured: 75 -> 46 µs a job's intake), and
 * the tenant's budget row is never locked where there is none. On a distributed database its
 * text is the function call, one command on the tenant's worker. */
static const struct db_stmt intake_plain = {
    .name = "intake_plain",
    .sql = INTAKE_INSERT "SELECT $1::bigint, $3::text, $2::text, decode($4::text, 'hex'), "
    "$5::smallint, $6::text, "
    "$7::text, $8::text, $9::text, $10::text, $11::bytea, 'prepared', $22::timestamptz, "
    "$22::timestamptz, $22::timestamptz + make_interval(hours => $12::integer), $13::text, "
    "$14::text, $15::integer, $16::text, $17::text, "
    "CASE WHEN $17::text IS NULL THEN 0 ELSE 1 END, "
    "CASE WHEN $17::text IS NOT NULL THEN c.at + make_interval(secs => $18::integer) END, "
    "CASE WHEN $17::text IS NULL THEN c.at ELSE c.at + make_interval(secs => $18::integer) END, "
    "$19::bigint, $20::text, false, $21::boolean "
    "FROM (SELECT now() AS at) c "
    "WHERE NOT EXISTS (SELECT 1 FROM tenant_budgets b WHERE b.tenant_id = $1::bigint) "
    "AND NOT EXISTS (SELECT 1 FROM provider_breakers k WHERE k.provider = $6::text) "
    "AND NOT EXISTS (SELECT 1 FROM key_tombstones t WHERE t.tenant_id = $1::bigint "
    " AND t.idempotency_key = $2::text) "
    "ON CONFLICT (tenant_id, idempotency_key) DO NOTHING "
    "RETURNING CASE WHEN lease_version = 1 THEN '2' ELSE '1' END",
    .sql_distributed = INTAKE_FUNCTION_SQL,
    .params = INTAKE_PARAMS,
    .moves = DB_MOVES({DB_NEW_ROW, ST_PREPARED}),
};

/* intake_plain for a whole batch, one statement (db_run_rows): each parameter an array of the
 * rows' values, in the batch's order (its lock order). A row it inserts answers its place in the
 * batch (the position of the id it proposed) and what intake_plain answers; a row it does not
 * insert answers nothing and is decided alone, as intake_plain's. */
static const struct db_stmt intake_rows = {
    .name = "intake_rows",
    .sql = "WITH i AS (" INTAKE_INSERT "SELECT j.tenant_id::bigint, j.new_id, j.key, "
    "decode(j.fingerprint, 'hex'), "
    "j.fingerprint_version::smallint, j.provider, j.route, j.method, j.url, j.credential, j.body, "
    "'prepared', j.at::timestamptz, j.at::timestamptz, "
    "j.at::timestamptz + make_interval(hours => j.ttl_hours::integer), j.idem_header, "
    "j.reconcile_strategy, j.outputs_requested::integer, j.profile_id, j.claim_owner, "
    "CASE WHEN j.claim_owner IS NULL THEN 0 ELSE 1 END, "
    "CASE WHEN j.claim_owner IS NOT NULL "
    " THEN c.at + make_interval(secs => j.lease_seconds::integer) END, "
    "CASE WHEN j.claim_owner IS NULL THEN c.at "
    " ELSE c.at + make_interval(secs => j.lease_seconds::integer) END, "
    "j.reserve_micros::bigint, j.currency, false, j.unpriced::boolean "
    "FROM (SELECT now() AS at) c, unnest($1::text[], $2::text[], $3::text[], $4::text[], "
    " $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::bytea[], "
    " $12::text[], $13::text[], $14::text[], $15::text[], $16::text[], $17::text[], $18::text[], "
    " $19::text[], $20::text[], $21::text[], $22::text[]) WITH ORDINALITY AS j(tenant_id, key, "
    " new_id, fingerprint, fingerprint_version, provider, route, method, url, credential, body, "
    " ttl_hours, idem_header, reconcile_strategy, outputs_requested, profile_id, claim_owner, "
    " lease_seconds, reserve_micros, currency, unpriced, at, n) "
    "WHERE " DB_ROWS_FEW("j.n") " "
    "AND NOT EXISTS (SELECT 1 FROM tenant_budgets b WHERE b.tenant_id = j.tenant_id::bigint) "
    "AND NOT EXISTS (SELECT 1 FROM provider_breakers k WHERE k.provider = j.provider) "
    "AND NOT EXISTS (SELECT 1 FROM key_tombstones t WHERE t.tenant_id = j.tenant_id::bigint "
    " AND t.idempotency_key = j.key) "
    "ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING tenant_id, id, lease_version) "
    /* Its place in the batch: the first position of the tenant and id it proposed (a join, not
     * a search of the array per row: batches may hold thousands). */
    "SELECT DISTINCT ON (i.tenant_id, i.id) k.n, "
    " CASE WHEN i.lease_version = 1 THEN '2' ELSE '1' END "
    "FROM i JOIN unnest($1::text[], $3::text[]) WITH ORDINALITY AS k(tenant_id, id, n) "
    " ON k.id = i.id AND k.tenant_id::bigint = i.tenant_id "
    "ORDER BY i.tenant_id, i.id, k.n",
    .params = INTAKE_PARAMS,
    .moves = DB_MOVES({DB_NEW_ROW, ST_PREPARED}),
};

#define INTAKE_NPARAMS 22

/* The function's answer (migrations/0014, 0032). */
enum { INTAKE_TAKEN, INTAKE_NEW, INTAKE_NEW_CLAIMED, INTAKE_REFUSED, INTAKE_TOMBSTONED };

/* Parses an answer of idemgate_intake: the outcome, the budget's verdict of a refusal, and the
 * breaker's reason of a new intent whose provider is tripped (a pointer into a, or NULL). -1 when
 * a is not such an answer. Pure. */
int store_intake_answer(const char *a, int *verdict, const char **blocked)
{
    *verdict = 0;
    *blocked = NULL;
    if (!a || !a[0])
        return -1;
    if (a[0] == 'r') {
        if (a[1] < '2' || a[1] > '5' || a[2])
            return -1;
        *verdict = a[1] - '0';
        return INTAKE_REFUSED;
    }
    if (a[0] == '0' && !a[1])
        return INTAKE_TAKEN;
    if (a[0] == 't' && !a[1])
        return INTAKE_TOMBSTONED;
    if ((a[0] != '1' && a[0] != '2') || (a[1] && a[1] != ':'))
        return -1;
    if (a[1] == ':')
        *blocked = a + 2;
    return a[0] == '1' ? INTAKE_NEW : INTAKE_NEW_CLAIMED;
}

int store_action_answer(const char *a, int *verdict)
{
    *verdict = 0;
    if (!a || !a[0])
        return 0;
    if (a[0] == 'r' && a[1] >= '2' && a[1] <= '5' && !a[2]) {
        *verdict = a[1] - '0';
        return 'r';
    }
    return (a[0] == '0' || a[0] == '1' || a[0] == 'n' || a[0] == 't') && !a[1] ? a[0] : 0;
}

static void intake_params(const struct store_intake_req *q, struct param ps[INTAKE_NPARAMS])
{
    const struct param v[INTAKE_NPARAMS] = {
        p_int("tenant_id", q->tenant_id),
        p_text("key", q->idempotency_key),
        p_text("new_id", q->new_id),
        p_text("fingerprint", q->fingerprint_hex),
        p_int("fingerprint_version", q->fingerprint_version),
        p_text("provider", q->provider),
        p_text("route", q->route),
        p_text("method", q->method),
        p_text("url", q->url),
        p_text("credential", q->credential),
        p_bytes("body", q->body, q->body_len),
        p_int("ttl_hours", q->ttl_hours),
        p_text("idem_header", q->idem_header),
        p_text("reconcile_strategy", q->reconcile_strategy),
        q->outputs_requested >= 0 ? p_int("outputs_requested", q->outputs_requested)
                                  : p_null("outputs_requested"),
        p_text("profile_id", q->profile_id),
        p_text("claim_owner", q->claim_owner),
        p_int("lease_seconds", q->lease_seconds),
        p_int("reserve_micros", q->reserve_micros),
        p_text("currency", q->currency),
        p_bool("unpriced", q->unpriced),
        p_text("at", q->at),
    };
    memcpy(ps, v, sizeof(v));
}

/* The job an inserted intent is, made from the request (its strings stay the request's; the
 * breaker's reason, when any, is copied). */
static int made_job(const struct store_intake_req *q, int claimed, const char *blocked,
                    struct store_job *j)
{
    memset(j, 0, sizeof(*j));
    j->tenant_id = q->tenant_id;
    j->id = q->new_id;
    j->idempotency_key = q->idempotency_key;
    j->fingerprint_hex = q->fingerprint_hex;
    j->provider = q->provider;
    j->route = q->route;
    j->state = ST_PREPARED;
    j->lease_version = claimed;
    j->generation_attempts = 1;
    j->created_at = j->updated_at = q->at;
    j->expires_at = q->expires_at;
    j->outputs_requested = q->outputs_requested;
    j->outputs_received = -1;
    j->reconcile_strategy = q->reconcile_strategy;
    j->profile_id = q->profile_id;
    j->currency = q->currency;
    j->reserved_micros = q->currency ? q->reserve_micros : 0;
    j->cost_micros = -1;
    if (blocked) {
        j->own = strdup(blocked);
        if (!j->own)
            return STORE_EINTERNAL;
        j->blocked_reason = j->own;
    }
    return STORE_OK;
}

/* The error of a budget verdict (idemgate_intake's, idemgate_regenerate's) that refused a
 * creation. */
static int budget_refusal(int verdict)
{
    return verdict == 2   ? STORE_EOVERDAY
           : verdict == 3 ? STORE_EOVERMONTH
           : verdict == 5 ? STORE_EUNPRICED
                          : STORE_EINFLIGHT;
}

/* A new key the tenant's budget refused: unless the key was recorded meanwhile — a racing
 * duplicate committed after the function's snapshot, which is replayed — the refusal. */
static int intake_refused(struct db *db, const struct store_intake_req *q, int verdict,
                          struct store_job *out, int *created)
{
    int e = read_by(db, &by_key, q->tenant_id, p_text("key", q->idempotency_key), out);
    if (e == STORE_OK)
        *created = strcmp(out->id, q->new_id) == 0;
    if (e != STORE_ENOTFOUND)
        return e;
    return budget_refusal(verdict);
}

/* Decides a request from the function's answer a (NULL: no answer). STORE_ERETRY when the key
 * was taken by an insert this transaction cannot see yet: the caller runs the function again. */
/* The tombstone a key's deleted job left (migration 0032): out holds what it kept — the job's
 * id, fingerprint, provider, route and end state, when the tombstone was written in its
 * finished_at — and the answer is STORE_EGONE; STORE_ERETRY when it was deleted meanwhile (the
 * key is free: decided again). */
static const struct db_stmt tombstone = {
    .rerun_safe = 1,
    .name = "tombstone",
    .sql = "SELECT job_id, encode(fingerprint, 'hex'), provider, route, state, "
    " to_char(written_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') "
    "FROM key_tombstones WHERE tenant_id = $1 AND idempotency_key = $2",
    .params = DB_PARAMS("tenant_id", "key"),
};

static int tombstone_get(struct db *db, long long tenant_id, const char *key,
                         struct store_job *out)
{
    PGresult *r;
    int e = db_run(db, &tombstone, DB_ARGS(p_int("tenant_id", tenant_id), p_text("key", key)),
                   &r);
    if (e < 0)
        return e;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return STORE_ERETRY;
    }
    memset(out, 0, sizeof(*out));
    out->res = r;
    out->tenant_id = tenant_id;
    out->id = PQgetvalue(r, 0, 0);
    out->idempotency_key = key;
    out->fingerprint_hex = PQgetvalue(r, 0, 1);
    out->provider = PQgetvalue(r, 0, 2);
    out->route = PQgetvalue(r, 0, 3);
    int st = st_parse(PQgetvalue(r, 0, 4));
    out->state = st < 0 ? ST_COMPLETED : (enum op_state)st;
    out->finished_at = PQgetvalue(r, 0, 5);
    out->outputs_requested = out->outputs_received = -1;
    out->cost_micros = -1;
    return STORE_EGONE;
}

static int intake_decide(struct db *db, const struct store_intake_req *q, const char *a,
                         struct store_job *out, int *created)
{
    int verdict;
    const char *blocked;
    int o = store_intake_answer(a, &verdict, &blocked);
    if (o == INTAKE_NEW || o == INTAKE_NEW_CLAIMED) {
        *created = 1;
        return made_job(q, o == INTAKE_NEW_CLAIMED, blocked, out);
    }
    if (o == INTAKE_REFUSED)
        return intake_refused(db, q, verdict, out, created);
    if (o == INTAKE_TOMBSTONED)
        return tombstone_get(db, q->tenant_id, q->idempotency_key, out);
    if (o != INTAKE_TAKEN)
        return STORE_EINTERNAL;
    int e = read_by(db, &by_key, q->tenant_id, p_text("key", q->idempotency_key), out);
    if (e == STORE_OK)
        *created = strcmp(out->id, q->new_id) == 0; /* ours, committed by an earlier try */
    return e == STORE_ENOTFOUND ? STORE_ERETRY : e;
}

/* Runs s, whose one row holds one text value: *out gets a copy (NULL for SQL NULL). */
static int run_text(struct db *db, const struct db_stmt *s, const struct param *ps, size_t n,
                    char **out)
{
    PGresult *r;
    *out = NULL;
    int e = db_run(db, s, ps, n, &r);
    if (e < 0)
        return e;
    if (PQntuples(r) == 1 && !PQgetisnull(r, 0, 0) && !(*out = strdup(PQgetvalue(r, 0, 0))))
        e = STORE_EINTERNAL;
    PQclear(r);
    return e;
}

int store_intake(struct db *db, const struct store_intake_req *q, struct store_job *out,
                 int *created)
{
    struct param ps[INTAKE_NPARAMS];
    intake_params(q, ps);
    *created = 0;
    /* A racing insert or a serialization failure is decided again, a bounded number of times. */
    int lost = 0;
    for (int tries = 0; tries < 5; tries++) {
        char *a = NULL;
        int e = run_text(db, &intake, ps, INTAKE_NPARAMS, &a);
        /* A connection lost mid-statement (even during the implicit COMMIT) leaves the outcome
         * unknown: one fresh connection and the same function decide. The row is ours when it
         * carries the id we proposed (the key is then taken, by us). */
        if ((e == STORE_EUNAVAIL && !lost++) || e == STORE_ERETRY)
            continue;
        if (e == STORE_OK)
            e = intake_decide(db, q, a, out, created);
        free(a);
        if (e != STORE_ERETRY)
            return e;
    }
    return STORE_ERETRY;
}

/* Row i of a committed batch: its answer, or — no answer (intake_plain's other cases: a budget, a
 * tripped breaker, a key taken), or a key taken by an insert the batch could not see — the
 * answer of the single-row intake, the function, which decides. */
static void batch_row(struct db *db, struct store_intake_item *it, PGresult *r)
{
    const char *a = r && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0) ? PQgetvalue(r, 0, 0) : NULL;
    it->err = a ? intake_decide(db, &it->q, a, &it->job, &it->created) : STORE_ERETRY;
    PQclear(r);
    if (it->err == STORE_ERETRY)
        it->err = store_intake(db, &it->q, &it->job, &it->created);
}

int store_intake_batch(struct db *db, struct store_intake_item *const *items, size_t n)
{
    struct param *ps = malloc(n * INTAKE_NPARAMS * sizeof(*ps));
    const struct param **rows = malloc(n * sizeof(*rows));
    PGresult **outs = malloc(n * sizeof(*outs));
    int e = ps && rows && outs ? STORE_OK : STORE_EINTERNAL;
    for (size_t i = 0; i < n && e == STORE_OK; i++) {
        intake_params(&items[i]->q, &ps[i * INTAKE_NPARAMS]);
        rows[i] = &ps[i * INTAKE_NPARAMS];
    }
    if (e == STORE_OK)
        e = db_run_rows(db, &intake_rows, &intake_plain, n, rows, INTAKE_NPARAMS,
                        (struct pg_result **)outs);
    /* Committed: each row answers for itself. Not (a bad row aborted the batch, the database
     * refused it, or — connection lost — the commit's fate is unknown): each row alone, with the
     * same function, which also tells a committed row by the id it proposed. Once a row alone
     * finds no connection to be had, the rest are answered so at once (503: the client's retry
     * under its key finds a row that did commit): each would try two connections of up to
     * DB_CONNECT_TIMEOUT_S, and a batch of 64 held its writer — and every intake queued behind
     * it — for minutes while the database was silent. An error the server answered (on Citus, a
     * worker of another tenant's shard gone) stops nothing: each row is still tried. */
    int down = 0;
    for (size_t i = 0; i < n; i++) {
        items[i]->created = 0;
        if (e == STORE_OK)
            batch_row(db, items[i], outs[i]);
        else if (down)
            items[i]->err = STORE_EUNAVAIL;
        else
            down = (items[i]->err = store_intake(db, &items[i]->q, &items[i]->job,
                                                 &items[i]->created)) == STORE_EUNAVAIL &&
                   !db_connected(db);
    }
    free(ps);
    free(rows);
    free(outs);
    return e;
}

int store_job_get(struct db *db, long long tenant_id, const char *job_id, struct store_job *out)
{
    return read_by(db, &job_get, tenant_id, p_text("job_id", job_id), out);
}

/* Cancel (migration 0023, idemgate_cancel): recorded once. A job never sent is failed at once;
 * one waiting to be sent again after an attempt that may have made its task (prepared with
 * ambiguous_at: a backoff under a provider key, or a resend after a proof that came later) is
 * unknown — never sent again, and reconciliation finds the task or proves it absent; an accepted
 * one has its provider cancel sent by the poller until the provider answers it for good
 * (cancel_sent_at, lease.c's poll_cancel_sent). Other live states keep
 * theirs; a terminal job is left as it is. One per-tenant function (a statement of modifying CTEs
 * was six steps on a distributed database); its moves are declared here and the job is read
 * after it (job_get). */
static const struct db_stmt cancel = {
    .name = "cancel",
    .sql = "SELECT idemgate_cancel($1::bigint, $2::text)",
    .params = DB_PARAMS("tenant_id", "job_id"),
    .moves = DB_MOVES({ST_PREPARED, ST_FAILED}, {ST_PREPARED, ST_UNKNOWN}, {ST_SENDING, ST_SENDING},
                      {ST_ACCEPTED, ST_ACCEPTED}, {ST_UNKNOWN, ST_UNKNOWN}, {ST_REVIEW, ST_REVIEW},
                      {ST_REVIEW, ST_ACCEPTED}),
    .filters = DB_FILTERS(ST_COMPLETED, ST_FAILED, ST_CANCELED),
};

/* Runs one of the action functions (cancel, resolve, regenerate), whose answer is one text:
 * "1" wrote, "0" left as it was, "n" no such row, "r<verdict>" refused by the budget. Returns
 * the answer's first character and, for a refusal, *verdict; 0 on an unknown answer. */
static int run_action(struct db *db, const struct db_stmt *s, const struct param *ps, size_t n,
                      int *verdict, int *err)
{
    char *a = NULL;
    *err = run_text(db, s, ps, n, &a);
    int c = *err == STORE_OK && a ? store_action_answer(a, verdict) : 0;
    if (*err == STORE_OK && !c) {
        LOG(LOG_ERROR, "action_answer_unknown", LS("statement", s->name));
        *err = STORE_EINTERNAL;
    }
    free(a);
    return c;
}

/* The job after an action that answered c ('1' or '0'): *flag 1 when the action wrote. */
static int action_job(struct db *db, int c, long long tenant_id, const char *job_id,
                      struct store_job *out, int *flag)
{
    if (c == 'n')
        return STORE_ENOTFOUND;
    *flag = c == '1';
    return read_by(db, &job_get, tenant_id, p_text("job_id", job_id), out);
}

int store_cancel(struct db *db, long long tenant_id, const char *job_id, struct store_job *out,
                 int *changed)
{
    int e, verdict;
    *changed = 0;
    int c = run_action(db, &cancel, DB_ARGS(p_int("tenant_id", tenant_id), p_text("job_id", job_id)),
                       &verdict, &e);
    if (e == STORE_OK)
        e = action_job(db, c, tenant_id, job_id, out, changed);
    if (e == STORE_OK && *changed)
        wake_state(out->id, out->state); /* failed, when it was never sent */
    return e;
}

/* An operator's decision on a job in review. Applied once; the same decision again is a no-op
 * that returns the job, another decision after it is refused by the caller. The target state is
 * st_resolve_target's; a cancelled job proven absent is failed, never sent again. */
static const struct db_stmt resolve = {
    .name = "resolve",
    .sql = "SELECT idemgate_resolve($1::bigint, $2::text, $3::text, $4::text, $5::text, $6::text, "
    "$7::text, $8::bigint)",
    .params = DB_PARAMS("tenant_id", "job_id", "outcome", "state", "by", "remote_id", "tenant",
                        "lease_version"),
    .moves = DB_MOVES({ST_REVIEW, ST_PREPARED}, {ST_REVIEW, ST_ACCEPTED}, {ST_REVIEW, ST_COMPLETED},
                      {ST_REVIEW, ST_FAILED}, {ST_REVIEW, ST_UNKNOWN}),
    .filters = DB_FILTERS(ST_CANCELED), /* the settle's terminal states */
};

int store_resolve(struct db *db, long long tenant_id, const char *tenant, const char *job_id,
                  const char *outcome,
                  enum op_state new_state, const char *remote_id, const char *by,
                  long long lease_version, struct store_job *out, int *applied)
{
    /* The statement is run only with a target it declares (see test_sql_states). */
    if (!db_stmt_moves(&resolve, ST_REVIEW, new_state)) {
        LOG(LOG_ERROR, "state_move_refused", LS("job_id", job_id), LS("from", "review"),
            LS("to", st_name(new_state)));
        return STORE_EINTERNAL;
    }
    int e, verdict;
    *applied = 0;
    int c = run_action(db, &resolve,
                       DB_ARGS(p_int("tenant_id", tenant_id), p_text("job_id", job_id),
                               p_text("outcome", outcome), p_text("state", st_name(new_state)),
                               p_text("by", by), p_text("remote_id", remote_id),
                               p_text("tenant", tenant), p_int("lease_version", lease_version)),
                       &verdict, &e);
    if (e == STORE_OK)
        e = action_job(db, c, tenant_id, job_id, out, applied);
    if (e == STORE_OK && *applied)
        wake_state(out->id, out->state);
    return e;
}

/* A deliberate new paid creation from a terminal job: a new operation with its own key, linked
 * to its parent, counted as one more generation. The parent is only read. Its estimate (the
 * parent's) is reserved against the tenant's budget as at intake. One per-tenant function
 * (migration 0023, idemgate_regenerate; ten steps as a statement of modifying CTEs on a
 * distributed database); the job is read after it. */
static const struct db_stmt regenerate = {
    .name = "regenerate",
    .sql = "SELECT idemgate_regenerate($1::bigint, $2::text, $3::text, $4::text, $5::text, "
    "$6::smallint, $7::integer)",
    .params = DB_PARAMS("tenant_id", "parent_id", "new_id", "key", "fingerprint",
                        "fingerprint_version", "ttl_hours"),
    .moves = DB_MOVES({DB_NEW_ROW, ST_PREPARED}),
    .filters = DB_FILTERS(ST_COMPLETED, ST_FAILED, ST_CANCELED),
};

/* Nothing inserted and no row with the key: a racing insert, or a parent that is not a terminal
 * job of this tenant. STORE_ERETRY: run the insert again. */
static int regenerate_missed(struct db *db, long long tenant_id, const char *parent_id,
                             const char *key, struct store_job *out, int *created)
{
    int e = read_by(db, &by_key, tenant_id, p_text("key", key), out);
    if (e == STORE_OK) {
        *created = 0;
        return e;
    }
    if (e != STORE_ENOTFOUND)
        return e;
    struct store_job parent;
    e = read_by(db, &job_get, tenant_id, p_text("job_id", parent_id), &parent);
    if (e != STORE_OK)
        return e;
    int terminal = st_is_terminal(parent.state);
    store_job_fini(&parent);
    return terminal ? STORE_ERETRY : STORE_ECONFLICT;
}

int store_regenerate(struct db *db, long long tenant_id, const char *parent_id, const char *new_id,
                     const char *key, const char *fp_hex, int fp_version, int ttl_hours,
                     struct store_job *out, int *created)
{
    *created = 0;
    for (int tries = 0; tries < 3; tries++) {
        int e, verdict;
        int c = run_action(db, &regenerate,
                           DB_ARGS(p_int("tenant_id", tenant_id), p_text("parent_id", parent_id),
                                   p_text("new_id", new_id), p_text("key", key),
                                   p_text("fingerprint", fp_hex),
                                   p_int("fingerprint_version", fp_version),
                                   p_int("ttl_hours", ttl_hours)),
                           &verdict, &e);
        if (e == STORE_OK && c == '1') {
            e = read_by(db, &job_get, tenant_id, p_text("job_id", new_id), out);
            *created = e == STORE_OK;
        } else if (e == STORE_OK && c == 't') {
            /* The key's job was deleted by retention: its tombstone answers (410 or 422). */
            e = tombstone_get(db, tenant_id, key, out);
        } else if (e == STORE_OK && (c == '0' || c == 'r')) {
            /* The key is taken (ours when it carries our id), or the budget refused a key
             * nobody held: unless it was recorded meanwhile, the refusal. */
            e = read_by(db, &by_key, tenant_id, p_text("key", key), out);
            if (e == STORE_OK)
                *created = strcmp(out->id, new_id) == 0;
            else if (e == STORE_ENOTFOUND)
                e = c == 'r' ? budget_refusal(verdict) : STORE_ERETRY;
        } else if (e == STORE_OK) {
            e = regenerate_missed(db, tenant_id, parent_id, key, out, created);
        }
        if (e == STORE_OK && *created)
            wake_work();
        if (e != STORE_ERETRY)
            return e;
    }
    return STORE_ERETRY;
}

/* Runs a statement returning (flag, JOB_COLS) rows and hands each job to cb (a row whose job id
 * is NULL is skipped); returns the number of rows, or a negative enum store_err. */
static int each_job(struct db *db, const struct db_stmt *s, const struct param *ps, size_t n,
                    void (*cb)(const struct store_job *, void *), void *arg)
{
    PGresult *r;
    int e = db_run(db, s, ps, n, &r);
    if (e < 0)
        return e;
    int rows = PQntuples(r);
    for (int i = 0; i < rows && e == STORE_OK; i++) {
        struct store_job j;
        if (PQgetisnull(r, i, JC_ID))
            continue; /* a row that only proves its tenant */
        e = job_from_row(r, i, 0, &j);
        if (e == STORE_OK) {
            cb(&j, arg);
            store_job_fini(&j);
        }
    }
    PQclear(r);
    return e < 0 ? e : rows;
}

#define STR_(x) #x
#define XSTR(x) STR_(x)
/* A list page's rows up to the first past JOBPAGE_BODY_BYTES of result bodies (jobpage.h), in the
 * page's order: each row's window sums the bodies before its predecessor, so the row past the
 * bound is answered (has_more) and those after it are never read out of the database. page: a
 * statement whose rows are the page, already limited (a window before the LIMIT would read the
 * whole history), each a job's columns, its tenant's name (NULL in a tenant's own list: the
 * column after the job's is read as the operator's tenant) and PAGE_KEYS. */
#define PAGE_KEYS(a)                                                                               \
    ", " a ".created_at AS page_at, " a ".id AS page_id, "                                         \
    "coalesce(octet_length(" a ".resp_body), 0) AS page_len"
#define PAGE_ORDER "ORDER BY x.page_at DESC, x.page_id DESC"
#define PAGE_CUT(page)                                                                             \
    "SELECT * FROM (SELECT x.*, sum(x.page_len) OVER (" PAGE_ORDER                                 \
    " ROWS BETWEEN UNBOUNDED PRECEDING AND 2 PRECEDING) AS page_cut, "                             \
    "row_number() OVER (" PAGE_ORDER ") AS page_pos FROM (" page ") x) z "                        \
    "WHERE coalesce(z.page_cut, 0) < " XSTR(JOBPAGE_BODY_BYTES) " ORDER BY z.page_pos"

/* The tenant's jobs, newest first: (created_at, id) before the cursor ($3, $4; 'infinity' and
 * '' for the first page), optionally of one provider ($2). In one state ($5) the scan is the
 * index of (tenant, state, created_at) read backwards; in every state it is that index read once
 * per state, each branch at most $6 rows, merged (Merge Append) — never a sort of the tenant's
 * whole history. By key ($5 of jobs_by_key) it is the key's one row. */
#define JOBS_PAGE_WHERE                                                                            \
    "o.tenant_id = $1 AND ($2::text IS NULL OR o.provider = $2) "                                  \
    "AND (o.created_at, o.id) < ($3::timestamptz, $4::text) "
#define JOBS_IN_STATE(st)                                                                          \
    "(SELECT * FROM operations o WHERE " JOBS_PAGE_WHERE "AND o.state = '" st "' "                 \
    "ORDER BY o.created_at DESC, o.id DESC LIMIT $5)"
static const struct db_stmt jobs_list = {
    .rerun_safe = 1,
    .name = "jobs_list",
    .sql = PAGE_CUT("SELECT 0, " JOB_COLS("o") ", NULL::text" PAGE_KEYS("o") " FROM ("
                    JOBS_IN_STATE("prepared") " UNION ALL " JOBS_IN_STATE("sending")
                    " UNION ALL " JOBS_IN_STATE("accepted") " UNION ALL "
                    JOBS_IN_STATE("unknown") " UNION ALL " JOBS_IN_STATE("review")
                    " UNION ALL " JOBS_IN_STATE("completed") " UNION ALL "
                    JOBS_IN_STATE("failed") " UNION ALL " JOBS_IN_STATE("canceled")
                    ") o ORDER BY o.created_at DESC, o.id DESC LIMIT $5"),
    .params = DB_PARAMS("tenant_id", "provider", "before_at", "before_id", "limit"),
};
static const struct db_stmt jobs_in_state = {
    .rerun_safe = 1,
    .name = "jobs_in_state",
    .sql = PAGE_CUT("SELECT 0, " JOB_COLS("o") ", NULL::text" PAGE_KEYS("o")
                    " FROM operations o WHERE " JOBS_PAGE_WHERE "AND o.state = $5 "
                    "ORDER BY o.created_at DESC, o.id DESC LIMIT $6"),
    .params = DB_PARAMS("tenant_id", "provider", "before_at", "before_id", "state", "limit"),
};
static const struct db_stmt jobs_by_key = {
    .rerun_safe = 1,
    .name = "jobs_by_key",
    .sql = "SELECT 0, " JOB_COLS("o") " FROM operations o WHERE " JOBS_PAGE_WHERE
    "AND o.idempotency_key = $5 AND ($6::text IS NULL OR o.state = $6)",
    .params = DB_PARAMS("tenant_id", "provider", "before_at", "before_id", "key", "state"),
};

int store_jobs_list(struct db *db, long long tenant_id, const struct store_jobs_query *q,
                    void (*cb)(const struct store_job *, void *), void *arg)
{
    const char *at = q->before_at ? q->before_at : "infinity";
    const char *id = q->before_id ? q->before_id : "";
    int rows;
    if (q->key)
        rows = each_job(db, &jobs_by_key,
                        DB_ARGS(p_int("tenant_id", tenant_id), p_text("provider", q->provider),
                                p_text("before_at", at), p_text("before_id", id),
                                p_text("key", q->key), p_text("state", q->state)),
                        cb, arg);
    else if (q->state)
        rows = each_job(db, &jobs_in_state,
                        DB_ARGS(p_int("tenant_id", tenant_id), p_text("provider", q->provider),
                                p_text("before_at", at), p_text("before_id", id),
                                p_text("state", q->state), p_int("limit", q->limit)),
                        cb, arg);
    else
        rows = each_job(db, &jobs_list,
                        DB_ARGS(p_int("tenant_id", tenant_id), p_text("provider", q->provider),
                                p_text("before_at", at), p_text("before_id", id),
                                p_int("limit", q->limit)),
                        cb, arg);
    return rows < 0 ? rows : STORE_OK;
}

/* A webhook. Signed: dedupe by event id; a hint that makes the operation due for a status read
 * now — also one its poll deadline sent to review, accepted again for that one read (the poll
 * claim flags it overdue: a read that does not show the task's end sends it back to review);
 * parked when the task is not linked yet; and when it names the client reference of an unknown
 * operation, the task id is kept for the reconciler to read and adopt — of one still
 * `sending` too (a create whose answer is then lost: the hint was parked under the task's id,
 * which the row never got, and the provider never delivers that event again), and of one sent
 * and waiting to be sent again (`prepared` after a back-off or an `absent` verdict: the task
 * exists, so it is `unknown` now, never sent again — webhooks usually follow the answer), and
 * of one in `review` without a remote id (a create whose answer was lost, past its recovery
 * window: `unknown` again, its task read and adopted — before, the event was parked under a
 * task id the row never got, and an operator's later `absent` paid a second task).
 * One that names the client reference of a job ended `failed` without a task (a refusal the
 * provider answered although it made the task, a cancel before a resend whose task then
 * appeared) cannot change it — a terminal state never changes, its row is not written — but the
 * proof of a paid task is not dropped silently either (before, parked under an id no row would
 * ever get, answered 200): `late` names it, and the caller logs the job and the task, counts
 * and alerts; nothing is parked. So does one that names the task of a job an operator ended
 * `failed` with it (`abandon` of a job whose task was known: before, answered 200 and nothing
 * said — the task linked, nothing parked, no state to hint); not one the provider itself
 * failed (its own `failed` webhook after the poller's read is no news). Said by every delivery, a
 * duplicate's too: the first one's answer
 * may have been lost after its commit (then the provider delivers again), and with it the only
 * saying.
 * Unsigned (anyone can send it): no row is written, nothing is parked, and a hint can bring a
 * status read forward to no sooner than 5 s after the row last changed. No state changes.
 * The provider names its task, not our tenant: a read finds the tenants of the operations with
 * that remote id (or that job id) first — on Citus one read of every shard, rare beside the
 * request path — and the writes then name them (`tenant_id = ANY`: their shards only; an UPDATE
 * of every shard costs ~20 times a read there, measured). An operation linked between the read
 * and the write is parked and unparked like one linked just after the webhook (lease.c, unpark).
 * The clock is read once (c.at); the unsigned arithmetic on a column is done in a pick, never in
 * the UPDATE (a distributed database refuses stable functions on columns there). A rescue keeps
 * the reaper's grace (lease.c, reap): a row reaped and not claimed since keeps its next attempt,
 * so a late result's write is not fenced by a reconciler the hint brought forward. */
static const struct db_stmt webhook_find = {
    .rerun_safe = 1,
    .name = "webhook_find",
    .sql = "SELECT tenant_id, bool_or(remote_id IS NOT DISTINCT FROM $2) FROM operations "
    "WHERE provider = $1 AND (remote_id = $2 OR ($3::text IS NOT NULL AND id = $3)) "
    "GROUP BY tenant_id",
    .params = DB_PARAMS("provider", "remote_id", "client_ref"),
};
/* A rescue takes a `review`, `unknown` or `prepared` row from whoever wrote it last or holds
 * it: a new fencing token, no lease, due now. A reconciler's verdict in flight was decided
 * without the hint — an `absent` from a search behind the provider's own events would send the
 * create again — and so was one that committed but whose answer was lost, which finish_run
 * writes again on a new connection: either is fenced now, dropped, and the next claim reads the
 * hint. Not taken: a
 * `sending` row (its create's write keeps the hint: FINISH_HINTED), a row the reaper made unknown
 * and nobody claimed since (its token waits for the late result: lease_owner NULL, its lease's
 * end kept), and an `unknown` row that holds this hint already (its reader is not started again
 * by every event the provider sends of one task). */
#define RESCUE_TAKES                                                                               \
    "(state = 'review' OR ((state = 'prepared' "                                                  \
    " OR (state = 'unknown' AND webhook_hint IS DISTINCT FROM $3)) "                              \
    " AND NOT (lease_owner IS NULL AND lease_expires_at IS NOT NULL)))"
static const struct db_stmt webhook_signed = {
    .name = "webhook_signed",
    .sql = "WITH c AS MATERIALIZED (SELECT now() AS at), "
    "ev AS (INSERT INTO webhook_events (provider, event_id, remote_id, expires_at) "
    " SELECT $1, $2, $3, c.at + make_interval(hours => $4) FROM c "
    " ON CONFLICT DO NOTHING RETURNING 1), "
    /* Due again at the statement's instant — or at the row's last write, when a poll claimed it
     * after this transaction began (its now() is older): the poll's result compares the two
     * (FINISH_DUE_AGAIN), and an instant before the claim's read as no hint at all. */
    "hint AS (UPDATE operations SET next_attempt_at = greatest(c.at, operations.updated_at), "
    " state = 'accepted' FROM c "
    " WHERE tenant_id = ANY ($6::bigint[]) AND provider = $1 AND remote_id = $3 "
    "  AND (" KEYED_STATE("state") " = 'accepted' OR (" KEYED_STATE("state") " = 'review' "
    "   AND poll_deadline_at IS NOT NULL)) AND EXISTS (SELECT 1 FROM ev) RETURNING id), "
    "rescue AS (UPDATE operations SET webhook_hint = $3, "
    " state = CASE WHEN state IN ('prepared', 'review') THEN 'unknown' ELSE state END, "
    " ambiguous_at = CASE WHEN state = 'prepared' THEN c.at ELSE ambiguous_at END, "
    " lease_version = CASE WHEN " RESCUE_TAKES " THEN lease_version + 1 ELSE lease_version END, "
    " lease_owner = CASE WHEN " RESCUE_TAKES " THEN NULL ELSE lease_owner END, "
    " lease_expires_at = CASE WHEN " RESCUE_TAKES " THEN NULL ELSE lease_expires_at END, "
    " updated_at = CASE WHEN state = 'prepared' OR " RESCUE_TAKES " THEN c.at "
    "  ELSE updated_at END, "
    " next_attempt_at = CASE WHEN state = 'sending' "
    "  OR (lease_owner IS NULL AND lease_expires_at IS NOT NULL) "
    "  THEN next_attempt_at ELSE c.at END FROM c "
    " WHERE tenant_id = ANY ($6::bigint[]) AND $5::text IS NOT NULL AND id = $5 "
    "  AND provider = $1 AND (" KEYED_STATE("state") " IN ('unknown', 'sending', 'review') "
    "   OR (" KEYED_STATE("state") " = 'prepared' AND first_sent_at IS NOT NULL "
    "    AND lease_owner IS NULL)) "
    "  AND remote_id IS NULL AND EXISTS (SELECT 1 FROM ev) RETURNING id), "
    "late AS (SELECT id FROM operations "
    " WHERE tenant_id = ANY ($6::bigint[]) AND provider = $1 "
    "  AND " KEYED_STATE("state") " = 'failed' "
    "  AND (($5::text IS NOT NULL AND id = $5 AND remote_id IS NULL) "
    "   OR (remote_id = $3 AND resolution = 'abandon'))), "
    "park AS (INSERT INTO webhook_parked (provider, remote_id) SELECT $1, $3 "
    " WHERE EXISTS (SELECT 1 FROM ev) AND NOT EXISTS (SELECT 1 FROM rescue) "
    "  AND NOT EXISTS (SELECT 1 FROM late) AND NOT $7::boolean "
    " ON CONFLICT DO NOTHING RETURNING 1) "
    "SELECT EXISTS (SELECT 1 FROM ev), (SELECT count(*) FROM hint) + (SELECT count(*) FROM rescue), "
    " EXISTS (SELECT 1 FROM park), (SELECT min(id) FROM late)",
    .params = DB_PARAMS("provider", "event_id", "remote_id", "window_hours", "client_ref",
                        "tenant_ids", "linked"),
    .moves = DB_MOVES({ST_ACCEPTED, ST_ACCEPTED}, {ST_UNKNOWN, ST_UNKNOWN},
                      {ST_SENDING, ST_SENDING}, {ST_REVIEW, ST_ACCEPTED},
                      {ST_PREPARED, ST_UNKNOWN}, {ST_REVIEW, ST_UNKNOWN}),
    .filters = DB_FILTERS(ST_FAILED),
};

/* webhook_signed's `late`, read again in a snapshot of its own once the event was parked: a job
 * whose refusal was being committed as the webhook came — the rescue waited for its lock, then
 * found it `failed` — is not in the statement's snapshot (it showed the job `sending`). */
static const struct db_stmt webhook_late = {
    .rerun_safe = 1,
    .name = "webhook_late",
    .sql = "SELECT count(*) FROM operations WHERE tenant_id = ANY ($3::bigint[]) AND id = $2 "
    " AND provider = $1 AND " KEYED_STATE("state") " = 'failed' AND remote_id IS NULL",
    .params = DB_PARAMS("provider", "client_ref", "tenant_ids"),
    .filters = DB_FILTERS(ST_FAILED),
};

static const struct db_stmt webhook_unsigned = {
    .name = "webhook_unsigned",
    .sql = "WITH c AS MATERIALIZED (SELECT now() AS at), "
    "p AS MATERIALIZED (SELECT o.tenant_id, o.id, "
    "  greatest(c.at, o.updated_at + interval '5 seconds') AS soonest FROM operations o, c "
    " WHERE o.tenant_id = ANY ($3::bigint[]) AND o.provider = $1 AND o.remote_id = $2 "
    "  AND " KEYED_STATE("o.state") " = 'accepted') "
    "UPDATE operations o SET next_attempt_at = least(o.next_attempt_at, p.soonest) FROM p "
    "WHERE o.tenant_id = ANY ($3::bigint[]) AND o.tenant_id = p.tenant_id AND o.id = p.id "
    " AND " KEYED_STATE("o.state") " = 'accepted' RETURNING o.id",
    .params = DB_PARAMS("provider", "remote_id", "tenant_ids"),
    .moves = DB_MOVES({ST_ACCEPTED, ST_ACCEPTED}),
};

/* The tenants of the operations a webhook names, as a bigint[] literal (*ids, malloc'd: every
 * one of them, however many), and whether one of them holds the remote id (linked). */
static int webhook_tenants(struct db *db, const struct store_webhook_req *w, char **ids,
                           int *linked)
{
    PGresult *r;
    int e = db_run(db, &webhook_find,
                   DB_ARGS(p_text("provider", w->provider), p_text("remote_id", w->remote_id),
                           p_text("client_ref", w->is_signed ? w->client_ref : NULL)),
                   &r);
    if (e < 0)
        return e;
    size_t cap = (size_t)PQntuples(r) * 21 + 3, pos = 0; /* ≤ 20 digits and a comma each */
    if (!(*ids = malloc(cap))) {
        PQclear(r);
        return STORE_EINTERNAL;
    }
    *linked = 0;
    (*ids)[pos++] = '{';
    for (int i = 0; i < PQntuples(r); i++) {
        pos += (size_t)snprintf(*ids + pos, cap - pos, "%s%lld", i ? "," : "",
                                atoll(PQgetvalue(r, i, 0)));
        *linked |= PQgetvalue(r, i, 1)[0] == 't';
    }
    (*ids)[pos++] = '}';
    (*ids)[pos] = '\0';
    PQclear(r);
    return STORE_OK;
}

int store_webhook(struct db *db, const struct store_webhook_req *w, int *fresh, int *hinted,
                  int *parked, char *late, size_t late_len)
{
    *late = '\0';
    char *ids = NULL;
    int linked = 0;
    int e = webhook_tenants(db, w, &ids, &linked);
    if (e < 0)
        return e;
    if (!w->is_signed) {
        long long n = 0;
        e = db_run_number(db, &webhook_unsigned,
                          DB_ARGS(p_text("provider", w->provider),
                                  p_text("remote_id", w->remote_id), p_text("tenant_ids", ids)),
                          DB_ROWS, &n);
        free(ids);
        if (e < 0)
            return e;
        *fresh = 1;
        *hinted = (int)n;
        *parked = 0;
        return STORE_OK;
    }
    PGresult *r;
    long long late_n = 0;
    e = db_run(db, &webhook_signed,
               DB_ARGS(p_text("provider", w->provider), p_text("event_id", w->event_id),
                       p_text("remote_id", w->remote_id), p_int("window_hours", w->window_hours),
                       p_text("client_ref", w->client_ref), p_text("tenant_ids", ids),
                       p_bool("linked", linked)),
               &r);
    if (e < 0) {
        free(ids);
        return e;
    }
    *fresh = PQgetvalue(r, 0, 0)[0] == 't';
    *hinted = atoi(PQgetvalue(r, 0, 1));
    *parked = PQgetvalue(r, 0, 2)[0] == 't';
    if (!PQgetisnull(r, 0, 3))
        snprintf(late, late_len, "%s", PQgetvalue(r, 0, 3));
    PQclear(r);
    /* (A failure here leaves the event parked, as before: it is said only when it can be.) */
    if (*parked && w->client_ref &&
        db_run_number(db, &webhook_late,
                      DB_ARGS(p_text("provider", w->provider), p_text("client_ref", w->client_ref),
                              p_text("tenant_ids", ids)),
                      DB_VALUE, &late_n) == STORE_OK && late_n > 0)
        snprintf(late, late_len, "%s", w->client_ref);
    free(ids);
    return STORE_OK;
}

/* The admin's resume: an accepted job, or one its poll deadline sent to review (the only review
 * with a poll deadline: the poller's; it has its task's id), is polled again under a new
 * deadline. */
static const struct db_stmt resume_polling = {
    .name = "resume_polling",
    .sql = "UPDATE operations SET state = 'accepted', "
    " poll_deadline_at = now() + make_interval(secs => $2::float8 / 1000), "
    " next_attempt_at = now(), updated_at = now() "
    "WHERE id = $1 AND (" KEYED_STATE("state") " = 'accepted' OR (" KEYED_STATE("state")
    " = 'review' AND poll_deadline_at IS NOT NULL AND remote_id IS NOT NULL)) RETURNING id",
    .params = DB_PARAMS("job_id", "deadline_ms"),
    .moves = DB_MOVES({ST_ACCEPTED, ST_ACCEPTED}, {ST_REVIEW, ST_ACCEPTED}),
};

int store_resume_polling(struct db *db, const char *job_id, long deadline_ms)
{
    long long n = 0;
    int e = db_run_number(db, &resume_polling,
                          DB_ARGS(p_text("job_id", job_id), p_int("deadline_ms", deadline_ms)),
                          DB_ROWS, &n);
    return e < 0 ? e : n == 1 ? STORE_OK : STORE_ENOTFOUND;
}

/* Retention (retention.h): terminal operations past their expiry, webhook deliveries past their
 * redelivery window, and parked hints that never found their operation; at most $1 rows of each,
 * skipping rows another replica's janitor or a worker holds. Operations one tenant at a time,
 * like every claim (turns.h), each with its attempt rows and its outputs' archive rows
 * (idemgate_janitor); then the webhook records, by their keys. */
/* Restated in SQL by idemgate_janitor (migration 0030): a change here is a change there. */
#define EXPIRED                                                                                    \
    "expires_at < now() AND " JOB_EXPIRY("operations") " < now() "                                   \
    "AND state IN ('completed', 'failed', 'canceled')"
static const struct db_stmt janitor_due = {
    .rerun_safe = 1,
    .name = "janitor_due",
    .sql = "SELECT tenant_id FROM operations WHERE " EXPIRED " GROUP BY tenant_id "
    "UNION SELECT tenant_id FROM key_tombstones WHERE expires_at < now() GROUP BY tenant_id",
    .filters = DB_FILTERS(ST_COMPLETED, ST_FAILED, ST_CANCELED),
};
/* The function (migrations 0030, 0032, 0033) deletes the tenant's key tombstones past their
 * time, writes one for each expired operation (its key is never free: a retry under it is
 * answered 410), and deletes, in a later sweep (10 minutes after its tombstone), each operation
 * with its attempt and archive rows, each in a statement of its own: one statement's snapshot
 * missed the children a writer committed between its start and its lock (no foreign key
 * cascades since 0030). An operation with an output still to be archived is kept until its copy
 * ends (0033). Its test of expiry is EXPIRED's, restated in SQL. */
static const struct db_stmt janitor = {
    .name = "janitor",
    .sql = "SELECT idemgate_janitor($2, $1)",
    .params = DB_PARAMS("limit", "tenant_id"),
};
static const struct db_stmt janitor_webhooks = {
    .name = "janitor_webhooks",
    .sql = "WITH a AS (DELETE FROM webhook_events WHERE (provider, event_id) IN ("
    "  SELECT provider, event_id FROM webhook_events WHERE expires_at < now() LIMIT $1) "
    "  RETURNING 1), "
    "b AS (DELETE FROM webhook_parked WHERE (provider, remote_id) IN (SELECT provider, remote_id "
    "  FROM webhook_parked WHERE received_at < now() - interval '1 day' LIMIT $1) RETURNING 1) "
    "SELECT (SELECT count(*) FROM a), (SELECT count(*) FROM b)",
    .params = DB_PARAMS("limit"),
};

static struct turns janitor_turns = TURNS_INIT;

struct janitor_run {
    int limit;
    long long deleted;
};

static int janitor_due_read(struct db *db, void *arg, long long **ids, size_t *n)
{
    (void)arg;
    return turns_read(db, &janitor_due, NULL, ids, n);
}

/* One tenant's expired operations, up to what is left of the limit; the next tenant while some
 * is left (turns_claim stops at STORE_OK). */
static int janitor_tenant(struct db *db, long long tenant, void *arg)
{
    struct janitor_run *j = arg;
    long long n = 0;
    int e = db_run_number(db, &janitor,
                          DB_ARGS(p_int("limit", j->limit - j->deleted),
                                  p_int("tenant_id", tenant)),
                          DB_VALUE, &n);
    if (e < 0)
        return e;
    j->deleted += n;
    return n && j->deleted >= j->limit ? STORE_OK : STORE_ENOTFOUND;
}

int store_janitor(struct db *db, int limit, long long deleted[3])
{
    struct janitor_run j = {limit, 0};
    memset(deleted, 0, 3 * sizeof(*deleted));
    int e = turns_claim(&janitor_turns, db, janitor_due_read, janitor_tenant, &j);
    deleted[0] = j.deleted;
    if (e != STORE_OK && e != STORE_ENOTFOUND)
        return e;
    PGresult *r;
    e = db_run(db, &janitor_webhooks, DB_ARGS(p_int("limit", limit)), &r);
    if (e < 0)
        return e;
    for (int k = 0; k < 2; k++)
        deleted[k + 1] = atoll(PQgetvalue(r, 0, k));
    PQclear(r);
    return STORE_OK;
}

/* The hook for the archive: of the sha256s given (the archive's objects), those that no
 * remaining operation names — neither its archived outputs (archive_outputs, counted while
 * their operation exists: a replica older than migration 0030 deletes jobs without them) nor
 * its stored upload (the
 * table of a body whose large parts are in the store, upload.h: "idemgate-upload/1\n" then
 * "<offset> <size> <sha256>\n" lines, at most MP_MAX_PARTS of them, so within its first 16 KiB).
 * A job that may still be sent or resent keeps its row, hence its objects. */
static const struct db_stmt unreferenced_sha256 = {
    .rerun_safe = 1,
    .name = "unreferenced_sha256",
    /* One read of the archived outputs and one of the upload tables that name any of the
     * digests, then the digests none names (no subquery correlated with unnest(), which a
     * distributed database refuses). The table is read as escaped text (encode … 'escape' leaves ASCII as it is), so
     * no byte of an uploaded part is ever taken for a digest. */
    .sql = "WITH used AS MATERIALIZED (SELECT a.sha256 AS s FROM archive_outputs a "
    " WHERE a.sha256 = ANY ($1::text[]) AND EXISTS (SELECT 1 FROM operations o "
    "  WHERE o.tenant_id = a.tenant_id AND o.id = a.op_id)), "
    "uploaded AS MATERIALIZED (SELECT m[1] AS s FROM operations o, "
    "  regexp_matches(substring(encode(substring(o.req_body FROM 1 FOR 16384), 'escape') FROM "
    "  '^idemgate-upload/1\n((?:[0-9]+ [0-9]+ [0-9a-f]{64}\n)+)\n'), "
    "  '[0-9]+ [0-9]+ ([0-9a-f]{64})\n', 'g') m "
    " WHERE substring(o.req_body FROM 1 FOR 18) = '\\x6964656d676174652d75706c6f61642f310a'::bytea "
    "  AND m[1] = ANY ($1::text[])) "
    "SELECT s FROM unnest($1::text[]) s "
    "WHERE s NOT IN (SELECT u.s FROM used u WHERE u.s IS NOT NULL) "
    "  AND s NOT IN (SELECT p.s FROM uploaded p)",
    .params = DB_PARAMS("sha256s"),
};

static const struct db_stmt terminal_ids = {
    .rerun_safe = 1,
    .name = "terminal_ids",
    .sql = "SELECT id FROM operations WHERE id = ANY($1::text[]) "
    " AND state IN ('completed', 'failed', 'canceled')",
    .params = DB_PARAMS("ids"),
};

/* Calls cb with the first column of every row of r, then frees r. */
static void each_text(PGresult *r, void (*cb)(const char *, void *), void *arg)
{
    for (int i = 0; i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), arg);
    PQclear(r);
}

int store_terminal_ids(struct db *db, const char *const *ids, size_t n,
                       void (*cb)(const char *, void *), void *arg)
{
    /* A text[] literal; job ids are [a-z0-9_] only, so no quoting is needed. */
    size_t cap = 3 + n * 32;
    char *arr = malloc(cap);
    if (!arr)
        return STORE_EINTERNAL;
    size_t pos = 0;
    arr[pos++] = '{';
    for (size_t i = 0; i < n; i++)
        pos += (size_t)snprintf(arr + pos, cap - pos, "%s%s", i ? "," : "", ids[i]);
    arr[pos++] = '}';
    arr[pos] = '\0';
    PGresult *r;
    int e = db_run(db, &terminal_ids, DB_ARGS(p_text("ids", arr)), &r);
    free(arr);
    if (e < 0)
        return e;
    each_text(r, cb, arg);
    return STORE_OK;
}

int store_unreferenced_sha256(struct db *db, const char *const *sha256s, size_t n,
                              void (*cb)(const char *sha256, void *arg), void *arg)
{
    /* A text[] literal; only lowercase hex digests are asked about, so no quoting is needed. */
    char *arr = malloc(3 + n * 66);
    if (!arr)
        return STORE_EINTERNAL;
    size_t pos = 0;
    arr[pos++] = '{';
    for (size_t i = 0; i < n; i++) {
        if (strlen(sha256s[i]) != 64 || strspn(sha256s[i], "0123456789abcdef") != 64) {
            free(arr);
            return STORE_EINTERNAL;
        }
        pos += (size_t)sprintf(arr + pos, "%s%s", i ? "," : "", sha256s[i]);
    }
    arr[pos++] = '}';
    arr[pos] = '\0';
    PGresult *r;
    int e = db_run(db, &unreferenced_sha256, DB_ARGS(p_text("sha256s", arr)), &r);
    free(arr);
    if (e < 0)
        return e;
    each_text(r, cb, arg);
    return STORE_OK;
}

static const struct db_stmt tenant_add = {
    .name = "tenant_add",
    .sql = "INSERT INTO tenants (name, token_sha256) VALUES ($1, $2)",
    .params = DB_PARAMS("name", "token"),
};
static const struct db_stmt tenant_revoke = {
    .name = "tenant_revoke",
    .sql = "UPDATE tenants SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL",
    .params = DB_PARAMS("name"),
};
static const struct db_stmt tenant_list = {
    .rerun_safe = 1,
    .name = "tenant_list",
    .sql = "SELECT name, " TS("tenants", "created_at") ", " TS("tenants", "revoked_at")
    " FROM tenants ORDER BY name",
};

int store_tenant_add(struct db *db, const char *name, const char *token)
{
    long long n;
    return db_run_number(db, &tenant_add, DB_ARGS(p_text("name", name), p_text("token", token)),
                         DB_ROWS, &n);
}

int store_tenant_revoke(struct db *db, const char *name)
{
    long long n = 0;
    int e = db_run_number(db, &tenant_revoke, DB_ARGS(p_text("name", name)), DB_ROWS, &n);
    return e < 0 ? e : n == 1 ? STORE_OK : STORE_ENOTFOUND;
}

int store_tenant_list(struct db *db,
                      void (*cb)(const char *, const char *, const char *, void *), void *arg)
{
    PGresult *r;
    int e = db_run(db, &tenant_list, NULL, 0, &r);
    if (e < 0)
        return e;
    for (int i = 0; i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), db_val(r, i, 2), arg);
    PQclear(r);
    return STORE_OK;
}

/* Usage and budgets (GET /v1/usage, `idemgate usage`): the settled cost of the completed (and
 * canceled: a cancelled task is paid for too; and abandoned by an operator: failed, but charged
 * what its task may have cost, as the budget counts it) operations that finished in [$2, $3)
 * (default: this UTC month until now), summed by tenant,
 * group ($4: provider, route or day) and currency; then one row per tenant with its budget
 * (NULLs without one) and what counts against it now. $1: a tenant's token hash (NULL: every
 * tenant, the admin's view), $5: one tenant by name (NULL: any). */
#define TODAY "(now() AT TIME ZONE 'UTC')::date"
/* A usage bound (usage.h: a date, or an RFC 3339 timestamp with its offset): a date is its UTC
 * midnight, whatever the session's TimeZone (a date cast to timestamptz is the session's own
 * midnight: on a server not set to UTC, the report disagreed with the budget's days). */
#define UTC_INSTANT(p)                                                                             \
    "(CASE WHEN length(" p "::text) = 10 THEN " p "::date::timestamp AT TIME ZONE 'UTC' "          \
    "ELSE " p "::timestamptz END)"
#define THIS_MONTH "date_trunc('month', now() AT TIME ZONE 'UTC')::date"
static const struct db_stmt usage = {
    .rerun_safe = 1,
    .name = "usage",
    .sql = "WITH t AS (SELECT id, name FROM tenants WHERE ($1::bigint IS NULL OR id = $1) "
    "  AND ($5::text IS NULL OR name = $5)), "
    "w AS (SELECT coalesce(" UTC_INSTANT("$2") ", " THIS_MONTH "::timestamp AT TIME ZONE 'UTC') "
    "  AS f, coalesce(" UTC_INSTANT("$3") ", 'infinity'::timestamptz) AS u) "
    "SELECT 'usage', t.name, CASE $4::text WHEN 'provider' THEN o.provider "
    "  WHEN 'route' THEN o.provider || '/' || o.route "
    "  ELSE to_char(o.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') END, o.currency, "
    "  count(*), sum(o.cost_micros)::bigint, NULL::bigint, NULL::bigint, NULL::bigint, "
    "  NULL::bigint "
    "FROM t JOIN operations o ON o.tenant_id = t.id, w "
    " WHERE (o.state IN ('completed', 'canceled') "
    "   OR (o.state = 'failed' AND o.resolution = 'abandon')) "
    " AND o.currency IS NOT NULL AND o.finished_at >= w.f AND o.finished_at < w.u "
    "GROUP BY 2, 3, 4 "
    "UNION ALL SELECT 'tenant', t.name, NULL, b.currency, b.day_limit_micros, "
    " CASE WHEN b.day = " TODAY " THEN b.day_micros ELSE 0 END, b.month_limit_micros, "
    " CASE WHEN b.month = " THIS_MONTH " THEN b.month_micros ELSE 0 END, b.max_inflight, "
    " b.inflight FROM t LEFT JOIN tenant_budgets b ON b.tenant_id = t.id "
    "ORDER BY 1 DESC, 2, 3, 4",
    .params = DB_PARAMS("tenant_id", "from", "to", "group_by", "tenant"),
    .filters = DB_FILTERS(ST_COMPLETED, ST_CANCELED, ST_FAILED),
};

int store_usage(struct db *db, long long tenant_id, const char *tenant, const char *from,
                const char *to, const char *group_by,
                void (*cb)(const struct store_usage_row *row, void *arg), void *arg)
{
    PGresult *r;
    int e = db_run(db, &usage,
                   DB_ARGS(tenant_id > 0 ? p_int("tenant_id", tenant_id) : p_null("tenant_id"),
                           p_text("from", from), p_text("to", to),
                           p_text("group_by", group_by), p_text("tenant", tenant)),
                   &r);
    if (e < 0)
        return e;
    int tenants = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        struct store_usage_row row = {.usage = PQgetvalue(r, i, 0)[0] == 'u',
                                      .tenant = PQgetvalue(r, i, 1),
                                      .group = db_val(r, i, 2),
                                      .currency = db_val(r, i, 3)};
        for (int k = 0; k < 6; k++)
            row.v[k] = db_val(r, i, 4 + k) ? atoll(db_val(r, i, 4 + k)) : -1;
        tenants += !row.usage;
        cb(&row, arg);
    }
    PQclear(r);
    return tenant_id > 0 && !tenants ? STORE_EAUTH : STORE_OK;
}

/* A tenant's budget (`idemgate tenant budget`). A new budget starts from what the tenant's
 * operations of this UTC day and month already count in its currency (settled costs, and the
 * reservations of those still running) — those retention deleted too (tenant_spend_retired,
 * migration 0036); it counts in flight the jobs an earlier budget of the tenant left running
 * (each still settles against the budget row when it ends: counted from 0, a tenant with k of
 * them could pass its in-flight limit by k) and the jobs recorded from then on — counted again
 * under the row's lock once it is written (budget_recount: a job that ended while this ran;
 * and the jobs still running that were recorded without a budget are adopted by it there, to
 * settle against it when they end: migration 0044).
 * Changing the limits keeps the counters; changing the currency starts them again. What is not
 * given is kept: the currency (USD on a new budget) and each limit ($6–$8) — `--day 50` on a EUR
 * budget switched it to USD (every EUR job then passed unchecked) and removed the month's and
 * the in-flight limits. (The kept values are read before the write: a distributed database
 * loses parameters named only in ON CONFLICT's SET.) */
#define BUDGET_NOW(col) "(SELECT b." col " FROM tenant_budgets b WHERE b.tenant_id = $1)"
static const struct db_stmt budget_set = {
    .name = "budget_set",
    .sql = "WITH c AS MATERIALIZED (SELECT now() AS at, " TODAY " AS day, " THIS_MONTH " AS month, "
    "  coalesce($2::text, " BUDGET_NOW("currency") ", 'USD') AS cur, "
    "  CASE WHEN $6::boolean THEN " BUDGET_NOW("day_limit_micros") " ELSE $3::bigint END AS dl, "
    "  CASE WHEN $7::boolean THEN " BUDGET_NOW("month_limit_micros") " ELSE $4::bigint END AS ml, "
    "  CASE WHEN $8::boolean THEN " BUDGET_NOW("max_inflight") " ELSE $5::integer END AS mi), "
    "s AS MATERIALIZED (SELECT coalesce(sum(coalesce(o.cost_micros, o.reserved_micros)) "
    "   FILTER (WHERE o.created_at >= c.day::timestamp AT TIME ZONE 'UTC'), 0) AS day_micros, "
    "  coalesce(sum(coalesce(o.cost_micros, o.reserved_micros)), 0) AS month_micros "
    " FROM c, operations o WHERE o.tenant_id = $1 AND o.currency = c.cur "
    "  AND o.created_at >= c.month::timestamp AT TIME ZONE 'UTC'), "
    "r AS MATERIALIZED (SELECT coalesce(sum(x.micros) FILTER (WHERE x.day >= c.day), 0) "
    "   AS day_micros, coalesce(sum(x.micros), 0) AS month_micros "
    " FROM c, tenant_spend_retired x WHERE x.tenant_id = $1 AND x.currency = c.cur "
    "  AND x.day >= c.month), "
    "f AS MATERIALIZED (SELECT count(*)::integer AS n FROM operations o "
    " WHERE o.tenant_id = $1 AND o.budgeted "
    "  AND o.state IN ('prepared', 'sending', 'accepted', 'unknown', 'review')) "
    "INSERT INTO tenant_budgets (tenant_id, currency, day_limit_micros, month_limit_micros, "
    " max_inflight, day, day_micros, month, month_micros, inflight, updated_at) "
    "SELECT $1, c.cur, c.dl, c.ml, c.mi, c.day, s.day_micros + r.day_micros, c.month, "
    " s.month_micros + r.month_micros, f.n, c.at FROM c, s, r, f "
    "ON CONFLICT (tenant_id) DO UPDATE SET day_limit_micros = EXCLUDED.day_limit_micros, "
    " month_limit_micros = EXCLUDED.month_limit_micros, max_inflight = EXCLUDED.max_inflight, "
    " day_micros = CASE WHEN tenant_budgets.currency = EXCLUDED.currency "
    "  THEN tenant_budgets.day_micros ELSE EXCLUDED.day_micros END, "
    " day = CASE WHEN tenant_budgets.currency = EXCLUDED.currency "
    "  THEN tenant_budgets.day ELSE EXCLUDED.day END, "
    " month_micros = CASE WHEN tenant_budgets.currency = EXCLUDED.currency "
    "  THEN tenant_budgets.month_micros ELSE EXCLUDED.month_micros END, "
    " month = CASE WHEN tenant_budgets.currency = EXCLUDED.currency "
    "  THEN tenant_budgets.month ELSE EXCLUDED.month END, "
    " currency = EXCLUDED.currency, updated_at = EXCLUDED.updated_at "
    "RETURNING currency, coalesce(day_limit_micros, -1), coalesce(month_limit_micros, -1), "
    " coalesce(max_inflight, -1)",
    .params = DB_PARAMS("tenant_id", "currency", "day_limit", "month_limit", "max_inflight",
                        "keep_day", "keep_month", "keep_inflight"),
};
static const struct db_stmt budget_currency = {
    .rerun_safe = 1,
    .name = "budget_currency",
    .sql = "SELECT currency FROM tenant_budgets WHERE tenant_id = $1",
    .params = DB_PARAMS("tenant_id"),
};
/* The counters of the budget just written, counted again under its row's lock (migration 0040):
 * a job that ended while budget_set ran took itself off no row, and stayed counted in flight.
 * $2: the spend too (a new budget, or a changed currency: budget_set counted it). */
static const struct db_stmt budget_recount = {
    .rerun_safe = 1,
    .name = "budget_recount",
    .sql = "SELECT idemgate_budget_recount($1::bigint, $2::boolean)",
    .params = DB_PARAMS("tenant_id", "spend"),
};
static const struct db_stmt budget_clear = {
    .name = "budget_clear",
    .sql = "DELETE FROM tenant_budgets WHERE tenant_id = $1",
    .params = DB_PARAMS("tenant_id"),
};
/* A tenant's id by its name, revoked or not (a budget is kept with its tenant's rows). */
static const struct db_stmt tenant_id_named = {
    .rerun_safe = 1,
    .name = "tenant_id_named",
    .sql = "SELECT id FROM tenants WHERE name = $1",
    .params = DB_PARAMS("name"),
};

/* The tenant's id is read first, so that the budget's statements name their tenant (one shard on
 * a distributed database). */
static int tenant_named(struct db *db, const char *name, long long *id)
{
    int e = db_run_number(db, &tenant_id_named, DB_ARGS(p_text("name", name)), DB_VALUE, id);
    return e == STORE_OK && *id <= 0 ? STORE_ENOTFOUND : e;
}

int store_budget_set(struct db *db, const char *tenant, struct store_budget *b)
{
    long long id = 0;
    int e = tenant_named(db, tenant, &id);
    if (e < 0)
        return e;
    PGresult *r;
    if ((e = db_run(db, &budget_currency, DB_ARGS(p_int("tenant_id", id)), &r)) < 0)
        return e;
    int existed = PQntuples(r) == 1;
    int changes = existed && b->currency[0] && strcmp(PQgetvalue(r, 0, 0), b->currency) != 0;
    PQclear(r);
    /* A limit kept across a change of currency would be the old amount in the new unit. */
    if (changes && (b->day_limit == STORE_BUDGET_KEEP || b->month_limit == STORE_BUDGET_KEEP))
        return STORE_ECONFLICT;
    e = db_run(db, &budget_set,
               DB_ARGS(p_int("tenant_id", id),
                       b->currency[0] ? p_text("currency", b->currency) : p_null("currency"),
                       b->day_limit >= 0 ? p_int("day_limit", b->day_limit) : p_null("day_limit"),
                       b->month_limit >= 0 ? p_int("month_limit", b->month_limit)
                                           : p_null("month_limit"),
                       b->max_inflight >= 0 ? p_int("max_inflight", b->max_inflight)
                                            : p_null("max_inflight"),
                       p_bool("keep_day", b->day_limit == STORE_BUDGET_KEEP),
                       p_bool("keep_month", b->month_limit == STORE_BUDGET_KEEP),
                       p_bool("keep_inflight", b->max_inflight == STORE_BUDGET_KEEP)),
               &r);
    if (e < 0)
        return e;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return STORE_ENOTFOUND;
    }
    snprintf(b->currency, sizeof(b->currency), "%s", PQgetvalue(r, 0, 0));
    b->day_limit = atoll(PQgetvalue(r, 0, 1));
    b->month_limit = atoll(PQgetvalue(r, 0, 2));
    b->max_inflight = atoll(PQgetvalue(r, 0, 3));
    PQclear(r);
    /* Its own transaction, once the row is there to lock: the jobs in flight always (an
     * existing budget's count is kept by the writes that move its jobs; counted again it is the
     * same, or healed), the spend where budget_set counted it. Run again, a moment later, when
     * PostgreSQL broke a deadlock with a batch (migration 0040) by failing it. */
    for (int tries = 0;; tries++) {
        e = db_run(db, &budget_recount,
                   DB_ARGS(p_int("tenant_id", id), p_bool("spend", !existed || changes)), &r);
        if (e != STORE_ERETRY || tries == 2)
            break;
        struct timespec pause = {0, 200L * 1000 * 1000 * (tries + 1)};
        nanosleep(&pause, NULL);
    }
    /* The budget is written whatever this says: a caller must not report it unset. */
    b->recount_err = e < 0 ? e : 0;
    if (e == STORE_OK)
        PQclear(r);
    return STORE_OK;
}

/* Per-tenant limits: -1 leaves a value to the configuration's default (NULL). The tenant's id is
 * read first, so that the write names its tenant (one shard on a distributed database). */
static const struct db_stmt live_tenant_id = {
    .rerun_safe = 1,
    .name = "live_tenant_id",
    .sql = "SELECT id FROM tenants WHERE name = $1 AND revoked_at IS NULL",
    .params = DB_PARAMS("name"),
};
static const struct db_stmt tenant_limits_set = {
    .name = "tenant_limits_set",
    .sql = "INSERT INTO tenant_limits (tenant_id, requests_per_second, burst, wait_connections, "
    " updated_at) "
    "VALUES ($1, nullif($2::integer, -1), nullif($3::integer, -1), nullif($4::integer, -1), now()) "
    "ON CONFLICT (tenant_id) DO UPDATE SET requests_per_second = excluded.requests_per_second, "
    " burst = excluded.burst, wait_connections = excluded.wait_connections, "
    " updated_at = excluded.updated_at",
    .params = DB_PARAMS("tenant_id", "rps", "burst", "waits"),
};
static const struct db_stmt tenant_limits_all = {
    .rerun_safe = 1,
    .name = "tenant_limits_all",
    .sql = "SELECT t.token_sha256, coalesce(l.requests_per_second, -1), coalesce(l.burst, -1), "
    " coalesce(l.wait_connections, -1) FROM tenants t "
    "LEFT JOIN tenant_limits l ON l.tenant_id = t.id WHERE t.revoked_at IS NULL",
};

int store_tenant_limits_set(struct db *db, const char *name, int rps, int burst, int waits)
{
    long long id = 0, n = 0;
    int e = db_run_number(db, &live_tenant_id, DB_ARGS(p_text("name", name)), DB_VALUE, &id);
    if (e == STORE_ENOTFOUND || (e == STORE_OK && id <= 0))
        return STORE_ENOTFOUND;
    if (e < 0)
        return e;
    e = db_run_number(db, &tenant_limits_set,
                      DB_ARGS(p_int("tenant_id", id), p_int("rps", rps), p_int("burst", burst),
                              p_int("waits", waits)),
                      DB_ROWS, &n);
    return e < 0 ? e : n == 1 ? STORE_OK : STORE_ENOTFOUND;
}

int store_budget_clear(struct db *db, const char *tenant)
{
    long long id = 0, n = 0;
    int e = tenant_named(db, tenant, &id);
    if (e < 0)
        return e;
    e = db_run_number(db, &budget_clear, DB_ARGS(p_int("tenant_id", id)), DB_ROWS, &n);
    return e < 0 ? e : n == 1 ? STORE_OK : STORE_ENOTFOUND;
}

int store_tenant_limits_all(struct db *db,
                            void (*cb)(const char *token_sha256, int rps, int burst, int waits,
                                       void *arg),
                            void *arg)
{
    PGresult *r;
    int e = db_run(db, &tenant_limits_all, NULL, 0, &r);
    if (e < 0)
        return e;
    for (int i = 0; i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), atoi(PQgetvalue(r, i, 1)), atoi(PQgetvalue(r, i, 2)),
           atoi(PQgetvalue(r, i, 3)), arg);
    PQclear(r);
    return STORE_OK;
}

static const struct db_stmt db_now = {
    .rerun_safe = 1,
    .name = "db_now",
    .sql = "SELECT floor(extract(epoch FROM clock_timestamp()))::bigint",
};

int store_db_now(struct db *db, long long *now)
{
    return db_run_number(db, &db_now, NULL, 0, DB_VALUE, now);
}

static const struct db_stmt schema_version = {
    .rerun_safe = 1,
    .name = "schema_version",
    .sql = "SELECT coalesce(max(version), 0) FROM schema_migrations",
};

int store_schema_version(struct db *db, int *version)
{
    long long v = 0;
    int e = db_run_number(db, &schema_version, NULL, 0, DB_VALUE, &v);
    if (e == STORE_OK)
        *version = (int)v;
    return e;
}

/* Provider credential breakers. */
static const struct db_stmt breaker_trip = {
    .rerun_safe = 1,
    .name = "breaker_trip",
    .sql = "INSERT INTO provider_breakers (provider, http_status, reason, job_id) "
    "VALUES ($1, $2, $3, $4) ON CONFLICT (provider) DO NOTHING",
    .params = DB_PARAMS("provider", "http_status", "reason", "job_id"),
};
static const struct db_stmt breaker_reset = {
    .rerun_safe = 1,
    .name = "breaker_reset",
    .sql = "DELETE FROM provider_breakers WHERE provider = $1",
    .params = DB_PARAMS("provider"),
};
static const struct db_stmt breaker_list = {
    .rerun_safe = 1,
    .name = "breaker_list",
    .sql = "SELECT provider, http_status, reason, " TS("provider_breakers", "tripped_at")
    " FROM provider_breakers ORDER BY provider",
};

int store_breaker_trip(struct db *db, const char *provider, int http_status, const char *reason,
                       const char *job_id)
{
    long long n;
    return db_run_number(db, &breaker_trip,
                        DB_ARGS(p_text("provider", provider), p_int("http_status", http_status),
                                p_text("reason", reason), p_text("job_id", job_id)), DB_ROWS,
                        &n);
}

int store_breaker_reset(struct db *db, const char *provider, int *cleared)
{
    long long n = 0;
    int e = db_run_number(db, &breaker_reset, DB_ARGS(p_text("provider", provider)), DB_ROWS, &n);
    if (e == STORE_OK)
        *cleared = n > 0;
    if (e == STORE_OK && n > 0)
        wake_work(); /* the provider's prepared operations may be claimed again */
    return e;
}

int store_breaker_list(struct db *db,
                       void (*cb)(const char *, int, const char *, const char *, void *),
                       void *arg)
{
    PGresult *r;
    int e = db_run(db, &breaker_list, NULL, 0, &r);
    if (e < 0)
        return e;
    for (int i = 0; i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), atoi(PQgetvalue(r, i, 1)), PQgetvalue(r, i, 2),
           PQgetvalue(r, i, 3), arg);
    PQclear(r);
    return STORE_OK;
}

/* Gauges for /metrics: every state (zero included) and the tripped providers. The states work
 * waits in are counted at every scrape, each along its own partial index: as many rows as wait,
 * whatever the history. The terminal states are nearly every row of a long history (their count
 * is a scan that grows with it: 0.4-0.6 s at 1 M rows, for every scrape of every replica): they
 * are counted at most every GAUGES_TERMINAL_EVERY_S and kept in between, in the same statement
 * as the other figures that may wait a minute: the most used share of any tenant's day and month
 * amount limits (tenant_budgets: a row per tenant with a budget), and the archive copies still
 * pending with the age of the oldest (along the pending copies' partial index) — a completed job
 * whose outputs are not planned yet counts as one, as old as its end (along
 * operations_archive_unplanned): no replica plans them when none archives that provider. */
#define GAUGES_TERMINAL_EVERY_S 60
#define BACKLOG_COUNT(st)                                                                          \
    "SELECT 'state', '" st "', (SELECT count(*) FROM operations WHERE state = '" st "') "
static const struct db_stmt gauges = {
    .rerun_safe = 1,
    .name = "gauges",
    .sql = BACKLOG_COUNT("prepared") "UNION ALL " BACKLOG_COUNT("sending") "UNION ALL "
    BACKLOG_COUNT("accepted") "UNION ALL " BACKLOG_COUNT("unknown") "UNION ALL "
    BACKLOG_COUNT("review") "UNION ALL SELECT 'tripped', provider, 1 FROM provider_breakers",
};
#define BUDGET_USED(period, limit, spent, current)                                                 \
    "SELECT '" period "', coalesce(max((CASE WHEN " current " THEN " spent " ELSE 0 END)::float8 " \
    "/ " limit "), 0) FROM tenant_budgets WHERE " limit " > 0 "
static const struct db_stmt gauges_terminal = {
    .rerun_safe = 1,
    .name = "gauges_terminal",
    /* One count per state, not a sub-select per row of unnest(): a distributed database
     * refuses a correlated sub-select beside a set-returning function (Citus, 0A000), and a
     * refused statement makes /readyz unready (stmthealth.h) — at every scrape. */
    .sql = "SELECT 'completed', count(*)::float8 FROM operations WHERE state = 'completed' "
    "UNION ALL SELECT 'failed', count(*)::float8 FROM operations WHERE state = 'failed' "
    "UNION ALL SELECT 'canceled', count(*)::float8 FROM operations WHERE state = 'canceled' "
    "UNION ALL " BUDGET_USED("budget_day", "day_limit_micros", "day_micros",
                             "day = (now() AT TIME ZONE 'UTC')::date")
    "UNION ALL " BUDGET_USED("budget_month", "month_limit_micros", "month_micros",
                             "month = date_trunc('month', now() AT TIME ZONE 'UTC')::date")
    "UNION ALL SELECT 'archive_pending', (SELECT count(*) FROM archive_outputs "
    " WHERE state = 'pending')::float8 + (SELECT count(*) FROM operations "
    " WHERE state = 'completed' AND archive_planned_at IS NULL)::float8 "
    "UNION ALL SELECT 'archive_oldest', greatest(coalesce(extract(epoch FROM now() - "
    " (SELECT min(created_at) FROM archive_outputs WHERE state = 'pending')), 0), "
    " coalesce(extract(epoch FROM now() - (SELECT min(finished_at) FROM operations "
    " WHERE state = 'completed' AND archive_planned_at IS NULL)), 0))::float8",
};
/* The rows of gauges_terminal, by name: the first three are states, the others (kind, name). */
#define SLOW_GAUGES 7
static const char *const slow_rows[SLOW_GAUGES][3] = {
    {"completed", "state", "completed"},       {"failed", "state", "failed"},
    {"canceled", "state", "canceled"},         {"budget_day", "budget", "day"},
    {"budget_month", "budget", "month"},       {"archive_pending", "archive", "pending"},
    {"archive_oldest", "archive", "oldest_pending_seconds"},
};

static struct {
    pthread_mutex_t mu;
    double read_at;       /* clock_mono of the last count (0: none yet) */
    int reading;          /* a scrape is counting them now */
    double n[SLOW_GAUGES]; /* as slow_rows */
} terminal_counts = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The terminal states' counts, read again when the last count is older than
 * GAUGES_TERMINAL_EVERY_S. One scrape reads (without the lock: the count may take seconds); the
 * others meanwhile report the last count. A failed read keeps the last count; with none yet it
 * is the error. */
static int gauges_terminal_counts(struct db *db, double n[SLOW_GAUGES])
{
    double now = clock_mono();
    pthread_mutex_lock(&terminal_counts.mu);
    int have = terminal_counts.read_at > 0;
    int due = !have || now - terminal_counts.read_at >= GAUGES_TERMINAL_EVERY_S;
    int read = due && (!terminal_counts.reading || !have);
    if (read)
        terminal_counts.reading++;
    memcpy(n, terminal_counts.n, sizeof(terminal_counts.n));
    pthread_mutex_unlock(&terminal_counts.mu);
    if (!read)
        return STORE_OK;
    PGresult *r;
    int e = db_run(db, &gauges_terminal, NULL, 0, &r);
    pthread_mutex_lock(&terminal_counts.mu);
    terminal_counts.reading--;
    if (e == STORE_OK) {
        for (int i = 0; i < PQntuples(r); i++)
            for (int k = 0; k < SLOW_GAUGES; k++)
                if (strcmp(PQgetvalue(r, i, 0), slow_rows[k][0]) == 0)
                    terminal_counts.n[k] = atof(PQgetvalue(r, i, 1));
        terminal_counts.read_at = now;
        PQclear(r);
    } else if (have) {
        e = STORE_OK; /* the last count stands */
    }
    memcpy(n, terminal_counts.n, sizeof(terminal_counts.n));
    pthread_mutex_unlock(&terminal_counts.mu);
    return e;
}

int store_gauges(struct db *db, void (*cb)(const char *kind, const char *name, double value,
                                           void *arg),
                 void *arg)
{
    double n[SLOW_GAUGES];
    PGresult *r;
    int e = db_run(db, &gauges, NULL, 0, &r);
    if (e < 0)
        return e;
    if ((e = gauges_terminal_counts(db, n)) < 0) {
        PQclear(r);
        return e;
    }
    for (int i = 0; i < PQntuples(r); i++) {
        cb(PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), (double)atoll(PQgetvalue(r, i, 2)), arg);
        if (i == 4) /* after review: the states in their usual order */
            for (int k = 0; k < 3; k++)
                cb(slow_rows[k][1], slow_rows[k][2], n[k], arg);
    }
    PQclear(r);
    for (int k = 3; k < SLOW_GAUGES; k++)
        cb(slow_rows[k][1], slow_rows[k][2], n[k], arg);
    return STORE_OK;
}

/* Operator reads (the CLI and the admin API): across tenants. Every index of operations leads
 * with the tenant, and PostgreSQL 15 has no skip scan: a read across tenants walks the tenants
 * (a few rows) and reads each one's own index (a LATERAL join), for at most a page, or a window,
 * each. A job row of the operator's carries its tenant's name after JOB_COLS.
 *
 * The job list, newest first: each tenant's (tenant_id, state, created_at) index (operations_by
 * _state) read backwards from the cursor ($3, $4), at most $5 rows per tenant (in every state:
 * the index read once per state and merged, as for a tenant's own list), the tenants' pages
 * merged and cut to $5; then the page's rows by their key. $1: one tenant by name, $2: one
 * provider (NULL: any). */
#define ADMIN_PAGE_WHERE                                                                           \
    "o.tenant_id = t.id AND ($2::text IS NULL OR o.provider = $2) "                                \
    "AND (o.created_at, o.id) < ($3::timestamptz, $4::text) "
#define ADMIN_IN_STATE(st)                                                                         \
    "(SELECT o.tenant_id, o.id, o.created_at FROM operations o WHERE " ADMIN_PAGE_WHERE            \
    "AND o.state = " st " ORDER BY o.created_at DESC, o.id DESC LIMIT $5)"
/* On a distributed database (Citus refuses a LIMIT in a lateral subquery over a reference table,
 * and the join of the page back to its rows): one statement that each shard runs with its own
 * ORDER BY … LIMIT, merged by the coordinator. */
#define ADMIN_PAGE_DISTRIBUTED(also)                                                               \
    PAGE_CUT("SELECT 0, " JOB_COLS("o") ", t.name" PAGE_KEYS("o") " FROM operations o "            \
             "JOIN tenants t ON t.id = o.tenant_id "                                               \
             "WHERE " ADMIN_PAGE_WHERE "AND ($1::text IS NULL OR t.name = $1) " also              \
             "ORDER BY o.created_at DESC, o.id DESC LIMIT $5")
#define ADMIN_PAGE(per_tenant)                                                                     \
    PAGE_CUT("SELECT 0, " JOB_COLS("o") ", p.name" PAGE_KEYS("o") " FROM (SELECT k.tenant_id, "    \
             "k.id, k.created_at, t.name FROM tenants t CROSS JOIN LATERAL (" per_tenant ") k "    \
             "WHERE ($1::text IS NULL OR t.name = $1) "                                            \
             "ORDER BY k.created_at DESC, k.id DESC LIMIT $5) p "                                  \
             "JOIN operations o ON o.tenant_id = p.tenant_id AND o.id = p.id")
static const struct db_stmt admin_jobs_list = {
    .rerun_safe = 1,
    .name = "admin_jobs_list",
    .sql = ADMIN_PAGE("SELECT * FROM (" ADMIN_IN_STATE("'prepared'") " UNION ALL "
                      ADMIN_IN_STATE("'sending'") " UNION ALL " ADMIN_IN_STATE("'accepted'")
                      " UNION ALL " ADMIN_IN_STATE("'unknown'") " UNION ALL "
                      ADMIN_IN_STATE("'review'") " UNION ALL " ADMIN_IN_STATE("'completed'")
                      " UNION ALL " ADMIN_IN_STATE("'failed'") " UNION ALL "
                      ADMIN_IN_STATE("'canceled'") ") u ORDER BY u.created_at DESC, u.id DESC "
                      "LIMIT $5"),
    .sql_distributed = ADMIN_PAGE_DISTRIBUTED(""),
    .params = DB_PARAMS("tenant", "provider", "before_at", "before_id", "limit"),
};
static const struct db_stmt admin_jobs_in_state = {
    .rerun_safe = 1,
    .name = "admin_jobs_in_state",
    .sql = ADMIN_PAGE("SELECT o.tenant_id, o.id, o.created_at FROM operations o WHERE "
                      ADMIN_PAGE_WHERE "AND o.state = $6 ORDER BY o.created_at DESC, o.id DESC "
                      "LIMIT $5"),
    .sql_distributed = ADMIN_PAGE_DISTRIBUTED("AND o.state = $6 "),
    .params = DB_PARAMS("tenant", "provider", "before_at", "before_id", "limit", "state"),
};
/* By idempotency key: one probe of each tenant's (tenant_id, idempotency_key) key. */
static const struct db_stmt admin_jobs_by_key = {
    .rerun_safe = 1,
    .name = "admin_jobs_by_key",
    .sql = PAGE_CUT("SELECT 0, " JOB_COLS("o") ", t.name" PAGE_KEYS("o")
                    " FROM tenants t JOIN operations o "
                    "ON o.tenant_id = t.id AND o.idempotency_key = $6 "
                    "WHERE ($1::text IS NULL OR t.name = $1) "
                    "AND ($2::text IS NULL OR o.provider = $2) "
                    "AND (o.created_at, o.id) < ($3::timestamptz, $4::text) "
                    "AND ($7::text IS NULL OR o.state = $7) "
                    "ORDER BY o.created_at DESC, o.id DESC LIMIT $5"),
    .params = DB_PARAMS("tenant", "provider", "before_at", "before_id", "limit", "key", "state"),
};

/* The operator's overview: one statement, one row per figure (store_overview_row), each part
 * along an index and bounded by a backlog or a window, never by the history:
 * - in doubt: the unknown and review rows, along their partial indexes (as many as wait);
 * - jobs created in the last 24 h by state and hour: each tenant's (tenant_id, state,
 *   created_at) index, an index-only range per tenant and state;
 * - spend over 30 UTC days and time to complete over 24 h: each tenant's settled rows
 *   (operations_spend_settled, (tenant_id, finished_at) of completed and canceled) in the
 *   window. The model is read from the stored request's top level, and only from bodies of at
 *   most 64 KiB that are a JSON object (a body is JSON at intake; `json`, not `jsonb`: no
 *   rebuild, and no refusal of a \u0000 elsewhere in the body); its JSON token is handed back;
 * - budgets: the tenant_budgets rows (one per tenant with a budget).
 * Each LATERAL subquery ends in OFFSET 0: a fence, so that it stays a scan of one tenant's index
 * per tenant; pulled up into a join, the planner may prefer one scan of the whole table (measured:
 * a parallel sequential scan of 1 M rows for a 30-day window, 3.9 s, against 0.4 s). */
#define OVERVIEW_DOUBT(st)                                                                         \
    "SELECT 'doubt', NULL::text, " st ", (SELECT o.id FROM operations o WHERE o.state = " st " "   \
    "  ORDER BY coalesce(o.first_sent_at, o.created_at), o.id LIMIT 1), NULL::text, count(*), "    \
    "  extract(epoch FROM now() - min(coalesce(o.first_sent_at, o.created_at)))::numeric, "        \
    "  extract(epoch FROM min(coalesce(o.first_sent_at, o.created_at)))::numeric, NULL::numeric, " \
    "  NULL::numeric "                                                                             \
    "FROM operations o WHERE o.state = " st " "
#define OVERVIEW_MODEL                                                                             \
    "CASE WHEN octet_length(o.req_body) NOT BETWEEN 2 AND 65536 THEN NULL "                        \
    "WHEN get_byte(o.req_body, 0) <> 123 THEN NULL "                                               \
    "ELSE (SELECT CASE WHEN json_typeof(x.b -> 'model') = 'string' THEN (x.b -> 'model')::text "   \
    "END FROM (SELECT convert_from(o.req_body, 'UTF8')::json AS b) x) END"
#define DAYS_AGO_29 "((" TODAY " - 29)::timestamp AT TIME ZONE 'UTC')"
/* The same rows on a distributed database (Citus refuses a LIMIT in a lateral subquery over the
 * tenants, a reference table, and a sub-select in a target list beside aggregates): each part a
 * CTE that every shard answers (counts and sums aggregated on the shards; the completion times
 * of the last 24 h brought to the coordinator for their percentiles), put together there. Each
 * shard reads its rows of the window without the tenant's index: an operator's page, not the
 * request path. */
#define OVERVIEW_MODEL_FLAT                                                                        \
    "CASE WHEN octet_length(o.req_body) NOT BETWEEN 2 AND 65536 THEN NULL "                        \
    "WHEN get_byte(o.req_body, 0) <> 123 THEN NULL "                                               \
    "WHEN json_typeof(convert_from(o.req_body, 'UTF8')::json -> 'model') = 'string' "             \
    "THEN (convert_from(o.req_body, 'UTF8')::json -> 'model')::text END"
#define OVERVIEW_DOUBT_CTES(n, st)                                                                 \
    "d" n " AS (SELECT count(*) AS n, min(coalesce(o.first_sent_at, o.created_at)) AS m "          \
    "  FROM operations o WHERE o.state = " st "), "                                                \
    "f" n " AS (SELECT o.id FROM operations o WHERE o.state = " st " "                             \
    "  ORDER BY coalesce(o.first_sent_at, o.created_at), o.id LIMIT 1), "
#define OVERVIEW_DOUBT_ROW(n, st)                                                                  \
    "SELECT 'doubt', NULL::text, " st ", (SELECT id FROM f" n "), NULL::text, d" n ".n, "          \
    "  extract(epoch FROM now() - d" n ".m)::numeric, extract(epoch FROM d" n ".m)::numeric, "     \
    "  NULL::numeric, NULL::numeric FROM d" n " "
#define OVERVIEW_DISTRIBUTED                                                                       \
    "WITH " OVERVIEW_DOUBT_CTES("u", "'unknown'") OVERVIEW_DOUBT_CTES("r", "'review'")            \
    "hr AS (SELECT o.state AS st, (floor(extract(epoch FROM o.created_at) / 3600) * 3600)::numeric " \
    "  AS h, count(*) AS n FROM operations o WHERE o.created_at >= now() - interval '24 hours' "    \
    "  GROUP BY 1, 2), "                                                                           \
    "sp AS (SELECT o.tenant_id, o.provider, " OVERVIEW_MODEL_FLAT " AS model, o.currency, "         \
    "  extract(epoch FROM date_trunc('day', o.finished_at AT TIME ZONE 'UTC'))::numeric AS d, "    \
    "  count(*) AS n, sum(o.cost_micros)::numeric AS c FROM operations o "                         \
    "  WHERE o.state IN ('completed', 'canceled') AND o.finished_at >= " DAYS_AGO_29               \
    "  AND o.currency IS NOT NULL AND o.cost_micros IS NOT NULL GROUP BY 1, 2, 3, 4, 5), "         \
    "tm AS (SELECT o.provider, greatest(extract(epoch FROM o.finished_at - o.created_at), 0) AS s "             \
    "  FROM operations o WHERE o.state = 'completed' "                                             \
    "  AND o.finished_at >= now() - interval '24 hours') "                                         \
    OVERVIEW_DOUBT_ROW("u", "'unknown'") "UNION ALL " OVERVIEW_DOUBT_ROW("r", "'review'")          \
    "UNION ALL SELECT 'hour', NULL, hr.st, NULL, NULL, hr.n, hr.h, NULL, NULL, NULL FROM hr "      \
    "UNION ALL SELECT 'spend', t.name, sp.provider, sp.model, sp.currency, sp.n, sp.c, sp.d, "      \
    "  NULL, NULL FROM sp JOIN tenants t ON t.id = sp.tenant_id "                                  \
    "UNION ALL SELECT 'time', NULL, tm.provider, NULL, NULL, count(*), "                           \
    "  percentile_cont(0.5) WITHIN GROUP (ORDER BY tm.s)::numeric, "                               \
    "  percentile_cont(0.95) WITHIN GROUP (ORDER BY tm.s)::numeric, NULL, NULL FROM tm GROUP BY 3 " \
    "UNION ALL SELECT 'budget', t.name, NULL, NULL, b.currency, NULL, "                            \
    "  b.day_limit_micros::numeric, b.month_limit_micros::numeric, "                               \
    "  (CASE WHEN b.day = " TODAY " THEN b.day_micros ELSE 0 END)::numeric, "                      \
    "  (CASE WHEN b.month = " THIS_MONTH " THEN b.month_micros ELSE 0 END)::numeric "              \
    "FROM tenant_budgets b JOIN tenants t ON t.id = b.tenant_id "                                  \
    "ORDER BY 1, 2, 3, 8, 4, 7"
static const struct db_stmt admin_overview = {
    .rerun_safe = 1,
    .name = "admin_overview",
    .sql = OVERVIEW_DOUBT("'unknown'") "UNION ALL " OVERVIEW_DOUBT("'review'")
    "UNION ALL SELECT 'hour', NULL, s.st, NULL, NULL, count(*), "
    "  (floor(extract(epoch FROM k.created_at) / 3600) * 3600)::numeric, NULL, NULL, NULL "
    "FROM tenants t CROSS JOIN unnest(ARRAY['prepared', 'sending', 'accepted', 'unknown', "
    "  'review', 'completed', 'failed', 'canceled']) s(st) "
    "CROSS JOIN LATERAL (SELECT o.created_at FROM operations o WHERE o.tenant_id = t.id "
    "  AND o.state = s.st AND o.created_at >= now() - interval '24 hours' OFFSET 0) k "
    "GROUP BY 3, 7 "
    "UNION ALL SELECT 'spend', t.name, k.provider, k.model, k.currency, count(*), "
    "  sum(k.cost_micros)::numeric, "
    "  extract(epoch FROM date_trunc('day', k.finished_at AT TIME ZONE 'UTC'))::numeric, "
    "  NULL, NULL "
    "FROM tenants t CROSS JOIN LATERAL (SELECT o.provider, o.currency, o.cost_micros, "
    "  o.finished_at, " OVERVIEW_MODEL " AS model FROM operations o WHERE o.tenant_id = t.id "
    "  AND o.state IN ('completed', 'canceled') AND o.finished_at >= " DAYS_AGO_29
    "  AND o.currency IS NOT NULL AND o.cost_micros IS NOT NULL OFFSET 0) k "
    "GROUP BY 2, 3, 4, 5, 8 "
    "UNION ALL SELECT 'time', NULL, k.provider, NULL, NULL, count(*), "
    "  percentile_cont(0.5) WITHIN GROUP (ORDER BY k.s)::numeric, "
    "  percentile_cont(0.95) WITHIN GROUP (ORDER BY k.s)::numeric, NULL, NULL "
    "FROM tenants t CROSS JOIN LATERAL (SELECT o.provider, "
    "  greatest(extract(epoch FROM o.finished_at - o.created_at), 0) AS s FROM operations o "
    "  WHERE o.tenant_id = t.id AND o.state = 'completed' "
    "  AND o.finished_at >= now() - interval '24 hours' OFFSET 0) k GROUP BY 3 "
    "UNION ALL SELECT 'budget', t.name, NULL, NULL, b.currency, NULL, "
    "  b.day_limit_micros::numeric, b.month_limit_micros::numeric, "
    "  (CASE WHEN b.day = " TODAY " THEN b.day_micros ELSE 0 END)::numeric, "
    "  (CASE WHEN b.month = " THIS_MONTH " THEN b.month_micros ELSE 0 END)::numeric "
    "FROM tenant_budgets b JOIN tenants t ON t.id = b.tenant_id "
    "ORDER BY 1, 2, 3, 8, 4, 7",
    .sql_distributed = OVERVIEW_DISTRIBUTED,
};
static const struct db_stmt admin_job_get = {
    .rerun_safe = 1,
    .name = "admin_job_get",
    .sql = "SELECT 0, " JOB_COLS("o") ", (SELECT t.name FROM tenants t WHERE t.id = o.tenant_id) "
    "FROM operations o WHERE o.id = $1",
    .params = DB_PARAMS("job_id"),
};
/* A job's attempts, oldest first: by its tenant and id, the attempts table's own key. */
static const struct db_stmt job_attempts = {
    .rerun_safe = 1,
    .name = "job_attempts",
    .sql = "SELECT a.seq, a.lease_version, a.kind, a.outcome, a.http_status, a.curl_code, "
    "a.bytes_sent, a.decision, a.error, " TS("a", "started_at") ", " TS("a", "finished_at")
    " FROM attempts a WHERE a.tenant_id = $1 AND a.operation_id = $2 ORDER BY a.seq",
    .params = DB_PARAMS("tenant_id", "job_id"),
};
/* The task id a verified webhook named for a job and left on its row, not yet read (the
 * reconciler keeps it when the task could not be read: reconciler.c, keep_hint), or none; and
 * the newest of its reconcile verdicts that saw its task without an id (RECON_SAW_TASK), else
 * its newest create the provider answered 2xx (SEEN_CREATE_ANSWERED and the status: a task was
 * made whose id or result the gateway could not read — no id where the profile reads it, an
 * answer over max_response_bytes or not the provider's JSON), else the record of a 2xx stream
 * kept on the row with no answer written after it (SEEN_STREAM_BEGAN: only a stream's batches
 * write a body without a status), or none. Read by a resolve with
 * the job in review, where nothing else writes them (a webhook takes a review back to unknown
 * instead: webhook_signed). */
static const struct db_stmt job_hint = {
    .rerun_safe = 1,
    .name = "job_hint",
    .sql = "SELECT o.webhook_hint, coalesce((SELECT a.outcome FROM attempts a "
    "  WHERE a.tenant_id = $1 AND a.operation_id = $2 AND a.kind = 'reconcile' "
    "  AND a.outcome = ANY ($3::text[]) ORDER BY a.seq DESC LIMIT 1), "
    " (SELECT '" SEEN_CREATE_ANSWERED "' || a.http_status FROM attempts a "
    "  WHERE a.tenant_id = $1 AND a.operation_id = $2 AND a.kind = 'create' "
    "  AND a.http_status BETWEEN 200 AND 299 ORDER BY a.seq DESC LIMIT 1), "
    " CASE WHEN o.resp_body IS NOT NULL AND o.resp_status IS NULL "
    "  THEN '" SEEN_STREAM_BEGAN "' END) "
    "FROM operations o WHERE o.tenant_id = $1 AND o.id = $2",
    .params = DB_PARAMS("tenant_id", "job_id", "saw_task"),
};

int store_job_hint(struct db *db, long long tenant_id, const char *job_id, char *out, size_t cap,
                   char *seen, size_t seen_cap)
{
    PGresult *r;
    *out = '\0';
    *seen = '\0';
    int e = db_run(db, &job_hint,
                   DB_ARGS(p_int("tenant_id", tenant_id), p_text("job_id", job_id),
                           p_text("saw_task", RECON_SAW_TASK)),
                   &r);
    if (e < 0)
        return e;
    e = PQntuples(r) == 1 ? STORE_OK : STORE_ENOTFOUND;
    if (e == STORE_OK && !PQgetisnull(r, 0, 0))
        snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
    if (e == STORE_OK && !PQgetisnull(r, 0, 1))
        snprintf(seen, seen_cap, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    return e;
}

static const struct db_stmt admin_tenant_of = {
    .rerun_safe = 1,
    .name = "admin_tenant_of",
    .sql = "SELECT t.id, t.name, t.token_sha256 FROM operations o "
    "JOIN tenants t ON t.id = o.tenant_id WHERE o.id = $1",
    .params = DB_PARAMS("job_id"),
};

int store_admin_jobs_page(struct db *db, const struct store_admin_jobs_query *q,
                          void (*cb)(const struct store_job *, void *), void *arg)
{
    const char *at = q->before_at ? q->before_at : "infinity";
    const char *id = q->before_id ? q->before_id : "";
    const struct db_stmt *s = q->key     ? &admin_jobs_by_key
                              : q->state ? &admin_jobs_in_state
                                         : &admin_jobs_list;
    /* $6 and $7 only where the statement takes them. */
    int n = q->key ? 7 : q->state ? 6 : 5;
    const struct param ps[] = {p_text("tenant", q->tenant),     p_text("provider", q->provider),
                               p_text("before_at", at),         p_text("before_id", id),
                               p_int("limit", q->limit),        p_text(q->key ? "key" : "state",
                                                                       q->key ? q->key : q->state),
                               p_text("state", q->state)};
    int rows = each_job(db, s, ps, (size_t)n, cb, arg);
    return rows < 0 ? rows : STORE_OK;
}

/* The CLI's list: pages of the operator's statement, each cut by its limit or by its result
 * bodies (jobpage.h), followed by their cursor until `limit` jobs were given or none is left. */
struct list_run {
    void (*cb)(const struct store_job *, void *);
    void *arg;
    int left, n, more;
    size_t bytes;
    char at[40], id[72];
};

static void list_run_row(const struct store_job *j, void *arg)
{
    struct list_run *l = arg;
    if (l->more || jobpage_past(l->n, l->left, l->bytes)) {
        l->more = 1;
        return;
    }
    l->n++;
    l->bytes += j->resp_body_len;
    snprintf(l->at, sizeof(l->at), "%s", j->created_at ? j->created_at : "");
    snprintf(l->id, sizeof(l->id), "%s", j->id);
    l->cb(j, l->arg);
}

int store_admin_jobs_list(struct db *db, const char *state, const char *provider, int limit,
                          void (*cb)(const struct store_job *, void *), void *arg)
{
    struct list_run l = {.cb = cb, .arg = arg, .left = limit};
    while (l.left > 0) {
        struct store_admin_jobs_query q = {.state = state,
                                           .provider = provider,
                                           .limit = l.left + 1,
                                           .before_at = l.at[0] ? l.at : NULL,
                                           .before_id = l.id[0] ? l.id : NULL};
        l.n = 0;
        l.more = 0;
        l.bytes = 0;
        int e = store_admin_jobs_page(db, &q, list_run_row, &l);
        if (e < 0)
            return e;
        l.left -= l.n;
        if (!l.more || !l.n)
            break;
    }
    return STORE_OK;
}

int store_admin_overview(struct db *db,
                         void (*cb)(const struct store_overview_row *row, void *arg), void *arg)
{
    PGresult *r;
    int e = db_run(db, &admin_overview, NULL, 0, &r);
    if (e < 0)
        return e;
    for (int i = 0; i < PQntuples(r); i++) {
        const char *n = db_val(r, i, 5);
        struct store_overview_row row = {
            .kind = PQgetvalue(r, i, 0), .tenant = db_val(r, i, 1), .name = db_val(r, i, 2),
            .sub = db_val(r, i, 3),      .currency = db_val(r, i, 4), .n = n ? atoll(n) : -1,
            .a = db_val(r, i, 6),        .b = db_val(r, i, 7),        .c = db_val(r, i, 8),
            .d = db_val(r, i, 9),
        };
        cb(&row, arg);
    }
    PQclear(r);
    return STORE_OK;
}

int store_admin_job_get(struct db *db, const char *job_id, struct store_job *out)
{
    return one_job(db, &admin_job_get, DB_ARGS(p_text("job_id", job_id)), out, NULL);
}

int store_job_attempts(struct db *db, long long tenant_id, const char *job_id,
                       void (*cb)(const struct store_attempt *a, void *arg), void *arg)
{
    PGresult *r;
    int e = db_run(db, &job_attempts, DB_ARGS(p_int("tenant_id", tenant_id), p_text("job_id", job_id)),
                   &r);
    if (e < 0)
        return e;
    for (int i = 0; i < PQntuples(r); i++) {
        const char *bytes = db_val(r, i, 6);
        struct store_attempt a = {
            .seq = atoll(PQgetvalue(r, i, 0)),
            .lease_version = atoll(PQgetvalue(r, i, 1)),
            .kind = db_val(r, i, 2),
            .outcome = db_val(r, i, 3),
            .http_status = int_or(r, i, 4, 0),
            .curl_code = int_or(r, i, 5, 0),
            .bytes_sent = bytes ? atoll(bytes) : -1,
            .decision = db_val(r, i, 7),
            .error = db_val(r, i, 8),
            .started_at = db_val(r, i, 9),
            .finished_at = db_val(r, i, 10),
        };
        cb(&a, arg);
    }
    PQclear(r);
    return STORE_OK;
}

int store_admin_tenant_of(struct db *db, const char *job_id, long long *tenant_id, char *name,
                          size_t cap, char token_sha256[65])
{
    PGresult *r;
    int e = db_run(db, &admin_tenant_of, DB_ARGS(p_text("job_id", job_id)), &r);
    if (e < 0)
        return e;
    e = PQntuples(r) == 1 ? STORE_OK : STORE_ENOTFOUND;
    if (e == STORE_OK) {
        *tenant_id = atoll(PQgetvalue(r, 0, 0));
        snprintf(name, cap, "%s", PQgetvalue(r, 0, 1));
        if (token_sha256)
            snprintf(token_sha256, 65, "%s", PQgetvalue(r, 0, 2));
    }
    PQclear(r);
    return e;
}

/* The tenant directory's reads (tenants.h). */
static const struct db_stmt tenant_of_token = {
    .rerun_safe = 1,
    .name = "tenant_of_token",
    .sql = "SELECT id, name FROM tenants WHERE token_sha256 = $1 AND revoked_at IS NULL",
    .params = DB_PARAMS("token"),
};
static const struct db_stmt tenants_all = {
    .rerun_safe = 1,
    .name = "tenants_all",
    .sql = "SELECT id, name, token_sha256 FROM tenants WHERE revoked_at IS NULL",
};

int store_tenant_of_token(struct db *db, const char *token_sha256, long long *id, char *name,
                          size_t cap)
{
    PGresult *r;
    *id = 0;
    int e = db_run(db, &tenant_of_token, DB_ARGS(p_text("token", token_sha256)), &r);
    if (e < 0)
        return e;
    e = PQntuples(r) == 1 ? STORE_OK : STORE_EAUTH;
    if (e == STORE_OK) {
        *id = atoll(PQgetvalue(r, 0, 0));
        snprintf(name, cap, "%s", PQgetvalue(r, 0, 1));
    }
    PQclear(r);
    return e;
}

int store_tenants_all(struct db *db,
                      void (*cb)(long long id, const char *name, const char *token, void *arg),
                      void *arg)
{
    PGresult *r;
    int e = db_run(db, &tenants_all, NULL, 0, &r);
    if (e < 0)
        return e;
    for (int i = 0; i < PQntuples(r); i++)
        cb(atoll(PQgetvalue(r, i, 0)), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2), arg);
    PQclear(r);
    return STORE_OK;
}

void store_stamp(long long sec, long usec, char out[STORE_STAMP_LEN])
{
    time_t t = (time_t)sec;
    struct tm tm;
    if (usec < 0 || usec > 999999)
        usec = 0;
    if (!gmtime_r(&t, &tm) || tm.tm_year < -1900 || tm.tm_year > 9999 - 1900) {
        snprintf(out, STORE_STAMP_LEN, "1970-01-01T00:00:00.000000Z");
        return;
    }
    char tmp[96]; /* what the compiler cannot bound; the year is 0..9999, so it fits */
    snprintf(tmp, sizeof(tmp), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, usec);
    memcpy(out, tmp, STORE_STAMP_LEN - 1);
    out[STORE_STAMP_LEN - 1] = '\0';
}

static const struct db_stmt *const statements[] = {
    &intake,         &intake_plain, &intake_rows,    &by_key,       &job_get,        &cancel,
    &resolve,        &regenerate,   &jobs_list,      &jobs_in_state, &jobs_by_key,    &webhook_find,
    &webhook_signed, &webhook_late, &webhook_unsigned,
    &resume_polling, &janitor,      &janitor_due,    &janitor_webhooks, &unreferenced_sha256,
    &usage,          &budget_set,   &budget_recount, &budget_clear,   &tenant_id_named,
    &terminal_ids,   &tenant_add,   &tenant_revoke,  &tenant_list,   &schema_version,
    &live_tenant_id, &tenant_limits_set, &tenant_limits_all,
    &breaker_trip,   &breaker_reset, &breaker_list,  &gauges,        &gauges_terminal,
    &admin_jobs_list, &admin_jobs_in_state, &admin_jobs_by_key, &admin_overview,
    &admin_job_get,  &admin_tenant_of, &job_attempts, &tenant_of_token, &tenants_all,
    &job_hint,
};

const struct db_stmt *const *store_statements(size_t *n)
{
    *n = sizeof(statements) / sizeof(statements[0]);
    return statements;
}
