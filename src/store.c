#include "idemgate/store.h"

#include "idemgate/clock.h"
#include "idemgate/log.h"

#include <libpq-fe.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How long a result write keeps trying while the database is unreachable. Past the lease the
 * reaper (once the database is back) may have moved the operation on; the write is then fenced,
 * which is safe. */
#define FINISH_RETRY_S 120.0

struct db {
    char *url;
    PGconn *conn;
    int ok;
    unsigned generation; /* +1 on every new connection: LISTEN must then be issued again */
};

/* The projection of a job, identical for every statement that returns one so that one reader
 * (job_from_row) serves them all. */
#define TS(a, c) "to_char(" a "." c " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
#define JOB_COLS(a)                                                                                \
    a ".tenant_id, " a ".id, " a ".idempotency_key, encode(" a ".fingerprint, 'hex'), " a          \
      ".provider, " a ".route, " a ".state, " a ".lease_version, " a ".transport_attempts, " a     \
      ".generation_attempts, " a ".parent_id, " a ".remote_id, " a ".resp_status, " a              \
      ".resp_headers, " a ".resp_body, " a ".last_error, " TS(a, "created_at") ", " TS(            \
          a, "updated_at") ", " TS(a, "first_sent_at") ", " TS(a, "finished_at") ", " TS(a,        \
          "expires_at") ", " a ".outputs_requested, " a ".outputs_received, " a ".usage, " a       \
      ".resolution, " a ".resolved_by, " TS(a, "resolved_at") ", " a ".reconcile_strategy, "       \
      "(SELECT b.reason FROM provider_breakers b WHERE b.provider = " a ".provider), " a         \
      ".provider_status, " a ".outputs, " TS(a, "cancel_requested_at") ", " a ".profile_id, " a   \
      ".polls"
enum {
    JC_TENANT, JC_ID, JC_KEY, JC_FP, JC_PROVIDER, JC_ROUTE, JC_STATE, JC_LEASE_VERSION,
    JC_TRANSPORT, JC_GENERATION, JC_PARENT, JC_REMOTE, JC_RESP_STATUS, JC_RESP_HEADERS,
    JC_RESP_BODY, JC_LAST_ERROR, JC_CREATED, JC_UPDATED, JC_FIRST_SENT, JC_FINISHED, JC_EXPIRES,
    JC_OUT_REQ, JC_OUT_RECV, JC_USAGE, JC_RESOLUTION, JC_RESOLVED_BY, JC_RESOLVED_AT, JC_STRATEGY,
    JC_BLOCKED, JC_PROVIDER_STATUS, JC_OUTPUTS, JC_CANCEL_REQ, JC_PROFILE, JC_POLLS, JC__COUNT
};

/* What a worker needs to act on an operation it claimed; read by the CC_ names below. Every claim
 * statement returns these, then one flag of its own (CC_CANCEL_DUE). */
#define CLAIM_COLS                                                                                 \
    "o.tenant_id, o.id, o.lease_version, o.provider, o.route, o.req_method, o.req_url, "          \
    "o.req_credential, o.req_body, extract(epoch FROM o.lease_expires_at - now())::float8, "      \
    "o.req_idem_header, o.reconcile_strategy, o.transport_attempts, "                              \
    "(extract(epoch FROM now() - o.first_sent_at) * 1000)::bigint, o.outputs_requested, "        \
    "o.remote_id, o.poll_url, o.polls, "                                                           \
    "extract(epoch FROM coalesce(o.first_sent_at, now()))::float8, "                              \
    "extract(epoch FROM now())::float8, o.ambiguous_at IS NOT NULL, "                            \
    "(extract(epoch FROM now() - coalesce(o.ambiguous_at, o.first_sent_at, now())) * 1000)::bigint, " \
    "o.cancel_requested_at IS NOT NULL, o.webhook_hint, coalesce(o.resolution = 'found', false)"
enum {
    CC_TENANT, CC_ID, CC_LEASE_VERSION, CC_PROVIDER, CC_ROUTE, CC_METHOD, CC_URL, CC_CREDENTIAL,
    CC_BODY, CC_LEASE_LEFT, CC_IDEM_HEADER, CC_STRATEGY, CC_TRANSPORT, CC_SINCE_FIRST,
    CC_OUT_REQ, CC_REMOTE, CC_POLL_URL, CC_POLLS, CC_FIRST_SENT, CC_NOW, CC_AMBIGUOUS,
    CC_SINCE_AMBIGUOUS, CC_CANCEL_REQ, CC_WEBHOOK_HINT, CC_OPERATOR_FOUND, CC_CANCEL_DUE
};

struct stmt {
    const char *name;
    const char *sql;
};

static const struct stmt stmts[] = {
    /* Intake: the tenant, the insert and the read of an existing row in one round trip. Zero rows
     * means a bad token, or a racing insert committed after this statement's snapshot: the
     * caller then reads again (by_key), which decides. */
    {"intake",
     "WITH t AS (SELECT id FROM tenants WHERE token_sha256 = $1 AND revoked_at IS NULL), "
     "ins AS (INSERT INTO operations (tenant_id, id, idempotency_key, fingerprint, "
     "  fingerprint_version, provider, route, req_method, req_url, req_credential, req_body, "
     "  state, expires_at, req_idem_header, reconcile_strategy, outputs_requested, profile_id) "
     " SELECT t.id, $3, $2, decode($4, 'hex'), $5, $6, $7, $8, $9, $10, $11, 'prepared', "
     "  now() + make_interval(hours => $12), $13, $14, $15::integer, $16 FROM t "
     " ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING *) "
     "SELECT 1, " JOB_COLS("ins") " FROM ins "
     "UNION ALL "
     "SELECT 0, " JOB_COLS("o") " FROM operations o JOIN t ON o.tenant_id = t.id "
     " WHERE o.idempotency_key = $2 AND NOT EXISTS (SELECT 1 FROM ins)"},
    /* The re-read after an intake that returned nothing: a row per live tenant, with the job
     * when the key exists. */
    {"by_key",
     "SELECT 0, " JOB_COLS("o") " FROM tenants t LEFT JOIN operations o "
     " ON o.tenant_id = t.id AND o.idempotency_key = $2 "
     "WHERE t.token_sha256 = $1 AND t.revoked_at IS NULL"},
    {"job_get",
     "SELECT 0, " JOB_COLS("o") " FROM tenants t LEFT JOIN operations o "
     " ON o.tenant_id = t.id AND o.id = $2 "
     "WHERE t.token_sha256 = $1 AND t.revoked_at IS NULL"},
    /* The claim commits `sending` and the new fencing token before any byte leaves. Providers
     * whose credential is tripped are skipped: their operations wait in `prepared`. */
    {"claim",
     "UPDATE operations o SET state = 'sending', lease_owner = $1, "
     " lease_version = o.lease_version + 1, "
     " lease_expires_at = now() + make_interval(secs => $2), "
     " transport_attempts = o.transport_attempts + 1, "
     " first_sent_at = coalesce(o.first_sent_at, now()), updated_at = now() "
     "FROM (SELECT tenant_id, id FROM operations p WHERE state = 'prepared' "
     "      AND cancel_requested_at IS NULL "
     "      AND next_attempt_at <= now() "
     "      AND provider NOT IN (SELECT b.provider FROM provider_breakers b) "
     "      ORDER BY next_attempt_at LIMIT 1 "
     "      FOR UPDATE SKIP LOCKED) c "
     "WHERE o.tenant_id = c.tenant_id AND o.id = c.id "
     "RETURNING " CLAIM_COLS ", false"},
    /* The reconciler's claim: an unknown operation that is due, under a new lease and fencing
     * token; the state stays unknown while it looks. */
    {"reconcile_claim",
     "UPDATE operations o SET lease_owner = $1, lease_version = o.lease_version + 1, "
     " lease_expires_at = now() + make_interval(secs => $2), updated_at = now() "
     "FROM (SELECT tenant_id, id FROM operations WHERE state = 'unknown' "
     "      AND next_attempt_at <= now() "
     "      AND (lease_expires_at IS NULL OR lease_expires_at < now()) "
     "      ORDER BY next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED) c "
     "WHERE o.tenant_id = c.tenant_id AND o.id = c.id "
     "RETURNING " CLAIM_COLS ", false"},
    /* A transport retry under the same provider idempotency key: unknown → sending, under the
     * lease the reconciler holds. */
    {"reconcile_send",
     "UPDATE operations SET state = 'sending', transport_attempts = transport_attempts + 1, "
     " lease_expires_at = now() + make_interval(secs => $4), updated_at = now() "
     "WHERE tenant_id = $1 AND id = $2 AND lease_version = $3 AND state = 'unknown' "
     " AND cancel_requested_at IS NULL "
     "RETURNING extract(epoch FROM lease_expires_at - now())::float8"},
    /* A result is written only under the lease that sent it (fencing); the attempt is recorded
     * whatever happens, as 'fenced' when the write was dropped. */
    {"finish",
     "WITH upd AS (UPDATE operations SET "
     "  state = CASE WHEN $4 = 'prepared' AND cancel_requested_at IS NOT NULL THEN 'failed' "
     "   ELSE $4 END, "
     "  resp_status = coalesce($5::integer, resp_status), "
     "  resp_headers = coalesce($6::jsonb, resp_headers), resp_body = coalesce($7, resp_body), "
     "  last_error = CASE WHEN $4 = 'prepared' AND cancel_requested_at IS NOT NULL "
     "   THEN 'canceled; not sent again' ELSE $8 END, "
     "  remote_id = coalesce($9, remote_id), lease_owner = NULL, "
     "  lease_expires_at = NULL, updated_at = now(), "
     "  next_attempt_at = now() + make_interval(secs => $15::float8 / 1000), "
     "  outputs_received = coalesce($18::integer, outputs_received), "
     "  outputs_requested = coalesce($19::integer, outputs_requested), "
     "  usage = coalesce($20::jsonb, usage), poll_url = coalesce($21, poll_url), "
     "  poll_deadline_at = CASE WHEN $22::bigint IS NULL THEN poll_deadline_at "
     "   ELSE now() + make_interval(secs => $22::float8 / 1000) END, "
     "  provider_status = coalesce($23, provider_status), outputs = coalesce($24::jsonb, outputs), "
     "  ambiguous_at = CASE WHEN $25::boolean OR ($17 = 'create' AND $4 = 'unknown') "
     "   THEN now() ELSE ambiguous_at END, "
     "  webhook_hint = CASE WHEN $17 = 'reconcile' THEN NULL ELSE webhook_hint END, "
     "  finished_at = CASE WHEN $4 IN ('completed', 'failed') "
     "   OR ($4 = 'prepared' AND cancel_requested_at IS NOT NULL) THEN now() END "
     " WHERE tenant_id = $1 AND id = $2 AND lease_version = $3 AND state = $16 "
     " RETURNING 1) "
     "INSERT INTO attempts (tenant_id, operation_id, lease_version, kind, started_at, "
     " finished_at, outcome, http_status, curl_code, bytes_sent, decision, error) "
     "SELECT $1, $2, $3, $17, to_timestamp($10), to_timestamp($11), $12, $5::integer, $13, $14, "
     " CASE WHEN EXISTS (SELECT 1 FROM upd) THEN $4 ELSE 'fenced' END, $8 "
     "RETURNING decision"},
    /* After a fenced write was re-run on a new connection: whether the first run had committed
     * (the row holds what it wrote, under the same fencing token, unowned). */
    {"finish_check",
     "SELECT 1 FROM operations WHERE tenant_id = $1 AND id = $2 AND lease_version = $3 "
     " AND lease_owner IS NULL AND (state = $4 OR ($4 = 'prepared' AND state = 'failed'))"},
    /* The poller's claim: an accepted operation due for a status read (or with a cancel to
     * send), within its poll deadline, under a new lease and fencing token. */
    {"poll_claim",
     "UPDATE operations o SET lease_owner = $1, lease_version = o.lease_version + 1, "
     " lease_expires_at = now() + make_interval(secs => $2), polls = o.polls + 1, "
     " cancel_sent_at = CASE WHEN o.cancel_requested_at IS NOT NULL THEN "
     "   coalesce(o.cancel_sent_at, now()) END, updated_at = now() "
     "FROM (SELECT tenant_id, id, "
     "      (cancel_requested_at IS NOT NULL AND cancel_sent_at IS NULL) AS cancel_due "
     "      FROM operations WHERE state = 'accepted' "
     "      AND (next_attempt_at <= now() "
     "           OR (cancel_requested_at IS NOT NULL AND cancel_sent_at IS NULL)) "
     "      AND (poll_deadline_at IS NULL OR poll_deadline_at > now()) "
     "      AND (lease_expires_at IS NULL OR lease_expires_at < now()) "
     "      ORDER BY next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED) c "
     "WHERE o.tenant_id = c.tenant_id AND o.id = c.id "
     "RETURNING " CLAIM_COLS ", c.cancel_due"},
    /* Cancel: recorded once. A job never sent is failed at once; an accepted one has its
     * provider cancel sent by the poller, once (cancel_sent_at). */
    {"cancel",
     "WITH t AS (SELECT id FROM tenants WHERE token_sha256 = $1 AND revoked_at IS NULL), "
     "upd AS (UPDATE operations o SET "
     "  cancel_requested_at = coalesce(o.cancel_requested_at, now()), "
     "  state = CASE WHEN o.state = 'prepared' THEN 'failed' ELSE o.state END, "
     "  finished_at = CASE WHEN o.state = 'prepared' THEN now() ELSE o.finished_at END, "
     "  last_error = CASE WHEN o.state = 'prepared' THEN 'canceled before it was sent' "
     "   ELSE o.last_error END, "
     "  lease_version = CASE WHEN o.state = 'prepared' THEN o.lease_version + 1 "
     "   ELSE o.lease_version END, "
     "  next_attempt_at = CASE WHEN o.state IN ('accepted', 'unknown') THEN now() "
     "   ELSE o.next_attempt_at END, "
     "  updated_at = now() "
     " FROM t WHERE o.tenant_id = t.id AND o.id = $2 "
     "  AND o.state NOT IN ('completed', 'failed') RETURNING o.*) "
     "SELECT 1, " JOB_COLS("upd") " FROM upd "
     "UNION ALL "
     "SELECT 0, " JOB_COLS("o") " FROM operations o JOIN t ON o.tenant_id = t.id "
     " WHERE o.id = $2 AND NOT EXISTS (SELECT 1 FROM upd)"},
    /* A verified webhook, in one statement: dedupe by event id; a hint that makes the
     * operation due for a status read now; parked when the task is not linked yet. */
    /* A webhook, in one statement. Signed: dedupe by event id; a hint that makes the operation
     * due for a status read now; parked when the task is not linked yet; and when it names the
     * client reference of an unknown operation, the task id is kept for the reconciler to read
     * and adopt. Unsigned (anyone can send it): no row is written, nothing is parked, and a hint
     * can bring a status read forward to no sooner than 5 s after the row last changed. */
    {"webhook",
     "WITH ev AS (INSERT INTO webhook_events (provider, event_id, remote_id, expires_at) "
     " SELECT $1, $2, $3, now() + make_interval(hours => $4) WHERE $5::boolean "
     " ON CONFLICT DO NOTHING RETURNING 1), "
     "fresh AS (SELECT NOT $5::boolean OR EXISTS (SELECT 1 FROM ev) AS f), "
     "hint AS (UPDATE operations SET next_attempt_at = CASE WHEN $5::boolean THEN now() "
     "   ELSE least(next_attempt_at, greatest(now(), updated_at + interval '5 seconds')) END "
     " WHERE provider = $1 AND remote_id = $3 AND state = 'accepted' "
     "  AND (SELECT f FROM fresh) RETURNING id), "
     "rescue AS (UPDATE operations SET webhook_hint = $3, next_attempt_at = now() "
     " WHERE $5::boolean AND $6::text IS NOT NULL AND id = $6 AND provider = $1 "
     "  AND state = 'unknown' AND remote_id IS NULL AND EXISTS (SELECT 1 FROM ev) RETURNING id), "
     "park AS (INSERT INTO webhook_parked (provider, remote_id) SELECT $1, $3 "
     " WHERE $5::boolean AND EXISTS (SELECT 1 FROM ev) AND NOT EXISTS (SELECT 1 FROM rescue) "
     "  AND NOT EXISTS (SELECT 1 FROM operations WHERE provider = $1 AND remote_id = $3) "
     " ON CONFLICT DO NOTHING RETURNING 1) "
     "SELECT (SELECT f FROM fresh), (SELECT count(*) FROM hint) + (SELECT count(*) FROM rescue), "
     " EXISTS (SELECT 1 FROM park)"},
    {"resume_polling",
     "UPDATE operations SET poll_deadline_at = now() + make_interval(secs => $2::float8 / 1000), "
     " next_attempt_at = now(), updated_at = now() "
     "WHERE id = $1 AND state = 'accepted' RETURNING id"},
    {"breaker_trip",
     "INSERT INTO provider_breakers (provider, http_status, reason, job_id) "
     "VALUES ($1, $2, $3, $4) ON CONFLICT (provider) DO NOTHING"},
    {"breaker_reset", "DELETE FROM provider_breakers WHERE provider = $1"},
    {"breaker_list",
     "SELECT provider, http_status, reason, " TS("provider_breakers", "tripped_at")
     " FROM provider_breakers ORDER BY provider"},
    {"jobs_list",
     "SELECT 0, " JOB_COLS("o") " FROM tenants t JOIN operations o ON o.tenant_id = t.id "
     "WHERE t.token_sha256 = $1 AND t.revoked_at IS NULL AND ($2::text IS NULL OR o.state = $2) "
     "ORDER BY o.created_at, o.id LIMIT $3"},
    /* An operator's decision on a job in review. Applied once; the same decision again is a
     * no-op that returns the job, another decision after it is refused by the caller. */
    {"resolve",
     "WITH t AS (SELECT id, name FROM tenants WHERE token_sha256 = $1 AND revoked_at IS NULL), "
     "upd AS (UPDATE operations o SET "
     "  state = CASE WHEN $4 = 'prepared' AND o.cancel_requested_at IS NOT NULL THEN 'failed' "
     "   ELSE $4 END, resolution = $3, "
     "  resolved_by = t.name || coalesce(' (' || $5 || ')', ''), "
     "  resolved_at = now(), remote_id = coalesce($6, o.remote_id), updated_at = now(), "
     "  webhook_hint = CASE WHEN $4 = 'unknown' THEN $6 ELSE o.webhook_hint END, "
     "  next_attempt_at = now(), lease_owner = NULL, lease_expires_at = NULL, "
     "  lease_version = o.lease_version + 1, "
     "  finished_at = CASE WHEN $4 IN ('completed', 'failed') "
     "   OR ($4 = 'prepared' AND o.cancel_requested_at IS NOT NULL) THEN now() END, "
     "  last_error = CASE WHEN $4 = 'prepared' AND o.cancel_requested_at IS NOT NULL "
     "   THEN 'canceled; not sent again' ELSE CASE $3 WHEN 'abandon' THEN 'abandoned by an operator' "
     "   WHEN 'absent' THEN 'proven absent by an operator' ELSE o.last_error END END "
     " FROM t WHERE o.tenant_id = t.id AND o.id = $2 AND o.state = 'review' RETURNING o.*) "
     "SELECT 1, " JOB_COLS("upd") " FROM upd "
     "UNION ALL "
     "SELECT 0, " JOB_COLS("o") " FROM operations o JOIN t ON o.tenant_id = t.id "
     " WHERE o.id = $2 AND NOT EXISTS (SELECT 1 FROM upd)"},
    /* A deliberate new paid creation from a terminal job: a new operation with its own key,
     * linked to its parent, counted as one more generation. */
    {"regenerate",
     "WITH t AS (SELECT id FROM tenants WHERE token_sha256 = $1 AND revoked_at IS NULL), "
     "p AS (SELECT o.* FROM operations o JOIN t ON o.tenant_id = t.id WHERE o.id = $2 "
     "      AND o.state IN ('completed', 'failed')), "
     "ins AS (INSERT INTO operations (tenant_id, id, idempotency_key, fingerprint, "
     "  fingerprint_version, provider, route, req_method, req_url, req_credential, req_body, "
     "  req_idem_header, reconcile_strategy, outputs_requested, state, expires_at, parent_id, "
     "  generation_attempts, profile_id) "
     " SELECT p.tenant_id, $3, $4, decode($5, 'hex'), $6, p.provider, p.route, p.req_method, "
     "  p.req_url, p.req_credential, p.req_body, p.req_idem_header, p.reconcile_strategy, "
     "  p.outputs_requested, 'prepared', now() + make_interval(hours => $7), p.id, "
     "  p.generation_attempts + 1, p.profile_id FROM p "
     " ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING *) "
     "SELECT 1, " JOB_COLS("ins") " FROM ins "
     "UNION ALL "
     "SELECT 0, " JOB_COLS("o") " FROM operations o JOIN t ON o.tenant_id = t.id "
     " WHERE o.idempotency_key = $4 AND NOT EXISTS (SELECT 1 FROM ins)"},
    /* Nobody can know whether a dead worker's bytes left: expired `sending` leases become
     * unknown, never prepared. */
    {"reap",
     "WITH r AS (UPDATE operations o SET state = 'unknown', lease_owner = NULL, "
     "  lease_expires_at = NULL, updated_at = now(), next_attempt_at = now(), "
     "  ambiguous_at = now(), "
     "  last_error = 'lease expired while sending' "
     " FROM (SELECT tenant_id, id FROM operations WHERE state = 'sending' "
     "       AND lease_expires_at < now() ORDER BY lease_expires_at LIMIT $1 "
     "       FOR UPDATE SKIP LOCKED) c "
     " WHERE o.tenant_id = c.tenant_id AND o.id = c.id "
     " RETURNING o.tenant_id, o.id, o.lease_version) "
     "INSERT INTO attempts (tenant_id, operation_id, lease_version, kind, outcome, decision, "
     " error) "
     "SELECT tenant_id, id, lease_version, 'create', 'lease_expired', 'unknown', "
     " 'lease expired while sending' FROM r RETURNING operation_id"},
    /* Housekeeping: webhook deliveries past their redelivery window, and parked hints that
     * never found their operation. */
    {"janitor",
     "WITH a AS (DELETE FROM webhook_events WHERE ctid IN (SELECT ctid FROM webhook_events "
     "  WHERE expires_at < now() LIMIT $1) RETURNING 1), "
     "b AS (DELETE FROM webhook_parked WHERE ctid IN (SELECT ctid FROM webhook_parked "
     "  WHERE received_at < now() - interval '1 day' LIMIT $1) RETURNING 1) "
     "SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM b)"},
    {"terminal_ids",
     "SELECT id FROM operations WHERE id = ANY($1::text[]) "
     " AND state IN ('completed', 'failed')"},
    {"tenant_add", "INSERT INTO tenants (name, token_sha256) VALUES ($1, $2)"},
    {"tenant_revoke",
     "UPDATE tenants SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL"},
    {"tenant_list",
     "SELECT name, " TS("tenants", "created_at") ", " TS("tenants", "revoked_at")
     " FROM tenants ORDER BY name"},
    {"schema_version", "SELECT coalesce(max(version), 0) FROM schema_migrations"},
    /* Operator commands (the CLI): across tenants. */
    {"admin_jobs_list",
     "SELECT 0, " JOB_COLS("o") " FROM operations o WHERE ($1::text IS NULL OR o.state = $1) "
     "ORDER BY o.created_at, o.id LIMIT $2"},
    {"admin_job_get", "SELECT 0, " JOB_COLS("o") " FROM operations o WHERE o.id = $1"},
    {"admin_token_of",
     "SELECT t.token_sha256 FROM operations o JOIN tenants t ON t.id = o.tenant_id "
     "WHERE o.id = $1"},
    /* Gauges for /metrics: every state (zero included) and the tripped providers. */
    {"gauges",
     "SELECT 'state', s, (SELECT count(*) FROM operations o WHERE o.state = s) "
     "FROM unnest(ARRAY['prepared','sending','accepted','unknown','review','completed',"
     "'failed']) s "
     "UNION ALL SELECT 'tripped', provider, 1 FROM provider_breakers"},
};
#define N_STMTS (sizeof(stmts) / sizeof(stmts[0]))

/* Prepares the statements; the schema may not exist yet (before `migrate`), so a failure to
 * prepare is not fatal: statements are prepared again lazily on first use. */
static void prepare_all(struct db *db)
{
    for (size_t i = 0; i < N_STMTS; i++) {
        PGresult *r = PQprepare(db->conn, stmts[i].name, stmts[i].sql, 0, NULL);
        PQclear(r);
    }
}

/* Server notices ("relation already exists, skipping") are not events: drop them. */
static void ignore_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

static int connect_db(struct db *db)
{
    if (db->conn && PQstatus(db->conn) == CONNECTION_OK)
        return STORE_OK;
    if (db->conn)
        PQfinish(db->conn);
    db->conn = PQconnectdb(db->url);
    if (PQstatus(db->conn) != CONNECTION_OK) {
        if (db->ok) /* log the transition, not every retry */
            LOG(LOG_WARN, "db_unavailable", LS("error", PQerrorMessage(db->conn)));
        db->ok = 0;
        PQfinish(db->conn);
        db->conn = NULL;
        return STORE_EUNAVAIL;
    }
    PQsetNoticeProcessor(db->conn, ignore_notice, NULL);
    db->ok = 1;
    db->generation++;
    prepare_all(db);
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

/* Maps a failed result to a store error. Connection failures mark the handle for reconnection. */
static int result_error(struct db *db, PGresult *r, const char *stmt)
{
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    if (!db->conn || PQstatus(db->conn) != CONNECTION_OK || !state ||
        strncmp(state, "08", 2) == 0 || strncmp(state, "57P", 3) == 0) {
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
    if (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0)
        return STORE_ERETRY;
    if (strcmp(state, "23505") == 0)
        return STORE_ECONFLICT;
    LOG(LOG_ERROR, "db_error", LS("statement", stmt), LS("sqlstate", state),
        LS("error", PQresultErrorMessage(r)));
    return STORE_EINTERNAL;
}

/* Runs a prepared statement. Text parameters, except those marked in `binary` (a bit per
 * parameter), which are sent as raw bytes (bytea). On success *out holds the result. */
static int run(struct db *db, const char *name, int n, const char *const *vals, const int *lens,
               unsigned binary, PGresult **out)
{
    int fmts[32] = {0};
    *out = NULL;
    if (n > (int)(sizeof(fmts) / sizeof(fmts[0]))) {
        LOG(LOG_ERROR, "db_error", LS("statement", name), LS("error", "too many parameters"));
        return STORE_EINTERNAL;
    }
    if (connect_db(db) < 0)
        return STORE_EUNAVAIL;
    for (int i = 0; i < n; i++)
        fmts[i] = (binary >> i) & 1u;
    PGresult *r = PQexecPrepared(db->conn, name, n, vals, lens, fmts, 0);
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    if (state && strcmp(state, "26000") == 0) {
        /* Not prepared yet (the connection predates the schema): prepare and run once more. */
        PQclear(r);
        prepare_all(db);
        r = PQexecPrepared(db->conn, name, n, vals, lens, fmts, 0);
    }
    ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        int e = result_error(db, r, name);
        PQclear(r);
        return e;
    }
    db->ok = 1;
    *out = r;
    return STORE_OK;
}

static const char *val(PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? NULL : PQgetvalue(r, row, col);
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

/* Decodes a bytea in PostgreSQL's hex output format ("\x…") into a new buffer. */
static int bytea_decode(const char *s, unsigned char **out, size_t *len)
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

/* Fills j from row `row` of r, whose first column is a flag and the rest JOB_COLS. With own set,
 * j takes ownership of r (store_job_fini frees it); otherwise r must outlive j. */
static int job_from_row(PGresult *r, int row, int own, struct store_job *j)
{
    const int o = 1;
    memset(j, 0, sizeof(*j));
    j->res = own ? r : NULL;
    j->tenant_id = atoll(PQgetvalue(r, row, o + JC_TENANT));
    j->id = val(r, row, o + JC_ID);
    j->idempotency_key = val(r, row, o + JC_KEY);
    j->fingerprint_hex = val(r, row, o + JC_FP);
    j->provider = val(r, row, o + JC_PROVIDER);
    j->route = val(r, row, o + JC_ROUTE);
    const char *st = val(r, row, o + JC_STATE);
    int s = st ? st_parse(st) : -1;
    j->state = s < 0 ? ST_UNKNOWN : (enum op_state)s;
    j->lease_version = atoll(PQgetvalue(r, row, o + JC_LEASE_VERSION));
    j->transport_attempts = atoi(PQgetvalue(r, row, o + JC_TRANSPORT));
    j->generation_attempts = atoi(PQgetvalue(r, row, o + JC_GENERATION));
    j->parent_id = val(r, row, o + JC_PARENT);
    j->remote_id = val(r, row, o + JC_REMOTE);
    j->resp_status = atoi(PQgetvalue(r, row, o + JC_RESP_STATUS));
    j->resp_headers = val(r, row, o + JC_RESP_HEADERS);
    j->last_error = val(r, row, o + JC_LAST_ERROR);
    j->created_at = val(r, row, o + JC_CREATED);
    j->updated_at = val(r, row, o + JC_UPDATED);
    j->first_sent_at = val(r, row, o + JC_FIRST_SENT);
    j->finished_at = val(r, row, o + JC_FINISHED);
    j->expires_at = val(r, row, o + JC_EXPIRES);
    j->outputs_requested = val(r, row, o + JC_OUT_REQ) ? atoi(val(r, row, o + JC_OUT_REQ)) : -1;
    j->outputs_received = val(r, row, o + JC_OUT_RECV) ? atoi(val(r, row, o + JC_OUT_RECV)) : -1;
    j->usage = val(r, row, o + JC_USAGE);
    j->resolution = val(r, row, o + JC_RESOLUTION);
    j->resolved_by = val(r, row, o + JC_RESOLVED_BY);
    j->resolved_at = val(r, row, o + JC_RESOLVED_AT);
    j->reconcile_strategy = val(r, row, o + JC_STRATEGY);
    j->blocked_reason = val(r, row, o + JC_BLOCKED);
    j->provider_status = val(r, row, o + JC_PROVIDER_STATUS);
    j->outputs = val(r, row, o + JC_OUTPUTS);
    j->cancel_requested_at = val(r, row, o + JC_CANCEL_REQ);
    j->profile_id = val(r, row, o + JC_PROFILE);
    j->polls = atoi(PQgetvalue(r, row, o + JC_POLLS));
    if (bytea_decode(val(r, row, o + JC_RESP_BODY), &j->resp_body, &j->resp_body_len) < 0) {
        store_job_fini(j);
        return STORE_EINTERNAL;
    }
    return STORE_OK;
}

void store_job_fini(struct store_job *j)
{
    PQclear(j->res);
    free(j->resp_body);
    memset(j, 0, sizeof(*j));
}

/* The re-read: a tenant row with or without the job. */
static int read_by(struct db *db, const char *stmt, const char *token, const char *key,
                   struct store_job *out)
{
    PGresult *r;
    const char *v[2] = {token, key};
    int e = run(db, stmt, 2, v, NULL, 0, &r);
    if (e < 0)
        return e;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return STORE_EAUTH;
    }
    if (PQgetisnull(r, 0, 1 + JC_ID)) {
        PQclear(r);
        return STORE_ENOTFOUND;
    }
    return job_from_row(r, 0, 1, out);
}

int store_intake(struct db *db, const struct store_intake_req *q, struct store_job *out,
                 int *created)
{
    char fpv[16], ttl[16], outs[16];
    snprintf(fpv, sizeof(fpv), "%d", q->fingerprint_version);
    snprintf(ttl, sizeof(ttl), "%d", q->ttl_hours);
    snprintf(outs, sizeof(outs), "%d", q->outputs_requested);
    const char *v[16] = {q->token_sha256_hex, q->idempotency_key, q->new_id, q->fingerprint_hex,
                         fpv, q->provider, q->route, q->method, q->url, q->credential, q->body,
                         ttl, q->idem_header, q->reconcile_strategy,
                         q->outputs_requested >= 0 ? outs : NULL, q->profile_id};
    int lens[16] = {0};
    lens[10] = (int)q->body_len;
    /* A racing insert or a serialization failure is read again, a bounded number of times. */
    int lost = 0;
    for (int tries = 0; tries < 5; tries++) {
        PGresult *r;
        int e = run(db, "intake", 16, v, lens, 1u << 10, &r);
        /* A connection lost mid-statement (even during the implicit COMMIT) leaves the outcome
         * unknown: one fresh connection and the same idempotent statement decide. The row is
         * ours when it carries the id we proposed. */
        if (e == STORE_EUNAVAIL && !lost++)
            continue;
        if (e == STORE_ERETRY)
            continue;
        if (e < 0)
            return e;
        if (PQntuples(r) > 0) {
            *created = atoi(PQgetvalue(r, 0, 0)) == 1 ||
                       strcmp(PQgetvalue(r, 0, 1 + JC_ID), q->new_id) == 0;
            return job_from_row(r, 0, 1, out);
        }
        PQclear(r);
        e = read_by(db, "by_key", q->token_sha256_hex, q->idempotency_key, out);
        if (e == STORE_OK)
            *created = strcmp(out->id, q->new_id) == 0;
        if (e != STORE_ENOTFOUND && e != STORE_ERETRY)
            return e;
    }
    return STORE_ERETRY;
}

int store_job_get(struct db *db, const char *token, const char *job_id, struct store_job *out)
{
    return read_by(db, "job_get", token, job_id, out);
}

void store_claim_fini(struct store_claim *c)
{
    PQclear(c->res);
    free(c->body);
    memset(c, 0, sizeof(*c));
}

static int claim_from(PGresult *r, struct store_claim *out)
{
    out->res = r;
    out->tenant_id = atoll(PQgetvalue(r, 0, CC_TENANT));
    out->id = PQgetvalue(r, 0, CC_ID);
    out->lease_version = atoll(PQgetvalue(r, 0, CC_LEASE_VERSION));
    out->provider = PQgetvalue(r, 0, CC_PROVIDER);
    out->route = PQgetvalue(r, 0, CC_ROUTE);
    out->method = PQgetvalue(r, 0, CC_METHOD);
    out->url = PQgetvalue(r, 0, CC_URL);
    out->credential = PQgetvalue(r, 0, CC_CREDENTIAL);
    out->lease_remaining_s = atof(PQgetvalue(r, 0, CC_LEASE_LEFT));
    out->idem_header = val(r, 0, CC_IDEM_HEADER);
    out->reconcile_strategy = PQgetvalue(r, 0, CC_STRATEGY);
    out->transport_attempts = atoi(PQgetvalue(r, 0, CC_TRANSPORT));
    out->since_first_ms = val(r, 0, CC_SINCE_FIRST) ? atoll(val(r, 0, CC_SINCE_FIRST)) : 0;
    out->outputs_requested = val(r, 0, CC_OUT_REQ) ? atoi(val(r, 0, CC_OUT_REQ)) : -1;
    out->remote_id = val(r, 0, CC_REMOTE);
    out->poll_url = val(r, 0, CC_POLL_URL);
    out->polls = atoi(PQgetvalue(r, 0, CC_POLLS));
    out->first_sent_db = atof(PQgetvalue(r, 0, CC_FIRST_SENT));
    out->now_db = atof(PQgetvalue(r, 0, CC_NOW));
    out->ambiguous_before = PQgetvalue(r, 0, CC_AMBIGUOUS)[0] == 't';
    out->since_ambiguous_ms = atoll(PQgetvalue(r, 0, CC_SINCE_AMBIGUOUS));
    out->cancel_requested = PQgetvalue(r, 0, CC_CANCEL_REQ)[0] == 't';
    out->webhook_hint = val(r, 0, CC_WEBHOOK_HINT);
    out->operator_found = PQgetvalue(r, 0, CC_OPERATOR_FOUND)[0] == 't';
    out->cancel_due = PQgetvalue(r, 0, CC_CANCEL_DUE)[0] == 't';
    if (bytea_decode(val(r, 0, CC_BODY), &out->body, &out->body_len) < 0) {
        store_claim_fini(out);
        return STORE_EINTERNAL;
    }
    return STORE_OK;
}

static int claim_with(struct db *db, const char *stmt, const char *owner, int lease_seconds,
                      struct store_claim *out)
{
    char secs[16];
    snprintf(secs, sizeof(secs), "%d", lease_seconds);
    const char *v[2] = {owner, secs};
    PGresult *r;
    memset(out, 0, sizeof(*out));
    int e = run(db, stmt, 2, v, NULL, 0, &r);
    if (e < 0)
        return e;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return STORE_ENOTFOUND;
    }
    return claim_from(r, out);
}

int store_poll_claim(struct db *db, const char *owner, int lease_seconds, struct store_claim *out)
{
    return claim_with(db, "poll_claim", owner, lease_seconds, out);
}

int store_claim(struct db *db, const char *owner, int lease_seconds, struct store_claim *out)
{
    return claim_with(db, "claim", owner, lease_seconds, out);
}

int store_reconcile_claim(struct db *db, const char *owner, int lease_seconds,
                          struct store_claim *out)
{
    return claim_with(db, "reconcile_claim", owner, lease_seconds, out);
}

int store_reconcile_send(struct db *db, struct store_claim *c, int lease_seconds)
{
    char tid[24], lv[24], secs[16];
    snprintf(tid, sizeof(tid), "%lld", c->tenant_id);
    snprintf(lv, sizeof(lv), "%lld", c->lease_version);
    snprintf(secs, sizeof(secs), "%d", lease_seconds);
    const char *v[4] = {tid, c->id, lv, secs};
    PGresult *r;
    int e = run(db, "reconcile_send", 4, v, NULL, 0, &r);
    if (e < 0)
        return e;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return STORE_ENOTFOUND;
    }
    c->lease_remaining_s = atof(PQgetvalue(r, 0, 0));
    c->transport_attempts++;
    PQclear(r);
    return STORE_OK;
}

int store_finish(struct db *db, const struct store_finish *f, int *applied)
{
    char tid[24], lv[24], status[16], t0[32], t1[32], curl[16], sent[24];
    snprintf(tid, sizeof(tid), "%lld", f->tenant_id);
    snprintf(lv, sizeof(lv), "%lld", f->lease_version);
    snprintf(status, sizeof(status), "%d", f->http_status);
    snprintf(t0, sizeof(t0), "%.6f", f->started_at);
    snprintf(t1, sizeof(t1), "%.6f", f->finished_at);
    snprintf(curl, sizeof(curl), "%d", f->curl_code);
    snprintf(sent, sizeof(sent), "%ld", f->bytes_sent);
    char delay[24], orecv[16], oreq[16], pdl[24];
    snprintf(pdl, sizeof(pdl), "%lld", f->poll_deadline_ms);
    snprintf(delay, sizeof(delay), "%ld", f->retry_delay_ms);
    snprintf(orecv, sizeof(orecv), "%d", f->outputs_received);
    snprintf(oreq, sizeof(oreq), "%d", f->outputs_requested);
    const char *v[25] = {tid,
                         f->id,
                         lv,
                         st_name(f->state),
                         f->http_status ? status : NULL,
                         f->resp_headers,
                         f->resp_body,
                         f->error,
                         f->remote_id,
                         t0,
                         t1,
                         f->outcome,
                         curl,
                         sent,
                         delay,
                         st_name(f->from),
                         f->kind ? f->kind : "create",
                         f->outputs_received >= 0 ? orecv : NULL,
                         f->outputs_requested >= 0 ? oreq : NULL,
                         f->usage,
                         f->poll_url,
                         f->poll_deadline_ms > 0 ? pdl : NULL,
                         f->provider_status,
                         f->outputs_json,
                         f->ambiguous ? "t" : "f"};
    int lens[25] = {0};
    lens[6] = (int)f->resp_body_len;
    PGresult *r;
    /* A result is never dropped for a lost connection (a PostgreSQL restart): the fenced write
     * is safe to run again, on a new connection, until it is written or fenced. */
    int e, lost = 0;
    long wait_ms = 50;
    double give_up = clock_mono() + FINISH_RETRY_S;
    while ((e = run(db, "finish", 25, v, lens, 1u << 6, &r)) == STORE_EUNAVAIL ||
           e == STORE_ERETRY) {
        lost |= e == STORE_EUNAVAIL;
        if (clock_mono() > give_up)
            return e;
        LOG(LOG_WARN, "result_write_retry", LS("job_id", f->id), LI("store_error", e),
            LI("wait_ms", wait_ms));
        clock_sleep_ms(wait_ms);
        wait_ms = wait_ms * 2 > 1000 ? 1000 : wait_ms * 2;
    }
    if (e < 0)
        return e;
    *applied = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "fenced") != 0;
    PQclear(r);
    if (!*applied && lost) {
        /* The connection may have died after the first run's commit: then the re-run met its
         * own write. The row tells. */
        const char *cv[4] = {tid, f->id, lv, st_name(f->state)};
        if (run(db, "finish_check", 4, cv, NULL, 0, &r) == STORE_OK) {
            *applied = PQntuples(r) == 1;
            PQclear(r);
        }
    }
    return STORE_OK;
}

int store_reap(struct db *db, int limit, int *count)
{
    char lim[16];
    snprintf(lim, sizeof(lim), "%d", limit);
    const char *v[1] = {lim};
    PGresult *r;
    int e = run(db, "reap", 1, v, NULL, 0, &r);
    if (e < 0)
        return e;
    *count = PQntuples(r);
    for (int i = 0; i < *count; i++)
        LOG(LOG_WARN, "lease_expired", LS("job_id", PQgetvalue(r, i, 0)), LS("state", "unknown"));
    PQclear(r);
    return STORE_OK;
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

int store_wait_notify(struct db *db, int timeout_ms, int wake_fd, void (*cb)(const char *, void *),
                      void *arg)
{
    if (!db->conn)
        return STORE_EUNAVAIL;
    int n = 0;
    PGnotify *nt;
    /* Notifications may already be buffered from an earlier call. */
    if (PQconsumeInput(db->conn) == 0)
        return result_error(db, NULL, "notify");
    while ((nt = PQnotifies(db->conn))) {
        cb(nt->extra, arg);
        PQfreemem(nt);
        n++;
    }
    if (n > 0)
        return n;
    struct pollfd pfd[2] = {{.fd = PQsocket(db->conn), .events = POLLIN},
                            {.fd = wake_fd, .events = POLLIN}};
    if (pfd[0].fd < 0)
        return result_error(db, NULL, "notify");
    if (poll(pfd, wake_fd >= 0 ? 2 : 1, timeout_ms) <= 0 || !(pfd[0].revents & POLLIN))
        return 0;
    if (PQconsumeInput(db->conn) == 0)
        return result_error(db, NULL, "notify");
    while ((nt = PQnotifies(db->conn))) {
        cb(nt->extra, arg);
        PQfreemem(nt);
        n++;
    }
    return n;
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
    const char *v[1] = {arr};
    PGresult *r;
    int e = run(db, "terminal_ids", 1, v, NULL, 0, &r);
    free(arr);
    if (e < 0)
        return e;
    for (int i = 0; i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), arg);
    PQclear(r);
    return STORE_OK;
}

int store_tenant_add(struct db *db, const char *name, const char *token)
{
    const char *v[2] = {name, token};
    PGresult *r;
    int e = run(db, "tenant_add", 2, v, NULL, 0, &r);
    PQclear(r);
    return e;
}

int store_tenant_revoke(struct db *db, const char *name)
{
    const char *v[1] = {name};
    PGresult *r;
    int e = run(db, "tenant_revoke", 1, v, NULL, 0, &r);
    if (e < 0)
        return e;
    e = atoi(PQcmdTuples(r)) == 1 ? STORE_OK : STORE_ENOTFOUND;
    PQclear(r);
    return e;
}

int store_tenant_list(struct db *db,
                      void (*cb)(const char *, const char *, const char *, void *), void *arg)
{
    PGresult *r;
    int e = run(db, "tenant_list", 0, NULL, NULL, 0, &r);
    if (e < 0)
        return e;
    for (int i = 0; i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), val(r, i, 2), arg);
    PQclear(r);
    return STORE_OK;
}

int store_schema_version(struct db *db, int *version)
{
    PGresult *r;
    int e = run(db, "schema_version", 0, NULL, NULL, 0, &r);
    if (e < 0)
        return e;
    *version = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return STORE_OK;
}

int store_breaker_trip(struct db *db, const char *provider, int http_status, const char *reason,
                       const char *job_id)
{
    char st[16];
    snprintf(st, sizeof(st), "%d", http_status);
    const char *v[4] = {provider, st, reason, job_id};
    PGresult *r;
    int e = run(db, "breaker_trip", 4, v, NULL, 0, &r);
    PQclear(r);
    return e;
}

int store_breaker_reset(struct db *db, const char *provider, int *cleared)
{
    const char *v[1] = {provider};
    PGresult *r;
    int e = run(db, "breaker_reset", 1, v, NULL, 0, &r);
    if (e < 0)
        return e;
    *cleared = atoi(PQcmdTuples(r)) > 0;
    PQclear(r);
    return STORE_OK;
}

int store_breaker_list(struct db *db,
                       void (*cb)(const char *, int, const char *, const char *, void *),
                       void *arg)
{
    PGresult *r;
    int e = run(db, "breaker_list", 0, NULL, NULL, 0, &r);
    if (e < 0)
        return e;
    for (int i = 0; i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), atoi(PQgetvalue(r, i, 1)), PQgetvalue(r, i, 2),
           PQgetvalue(r, i, 3), arg);
    PQclear(r);
    return STORE_OK;
}

/* Runs a statement returning (flag, JOB_COLS) rows and hands each job to cb. */
static int each_job(struct db *db, const char *stmt, int n, const char *const *v,
                    void (*cb)(const struct store_job *, void *), void *arg)
{
    PGresult *r;
    int e = run(db, stmt, n, v, NULL, 0, &r);
    if (e < 0)
        return e;
    for (int i = 0; i < PQntuples(r) && e == STORE_OK; i++) {
        struct store_job j;
        e = job_from_row(r, i, 0, &j);
        if (e == STORE_OK) {
            cb(&j, arg);
            store_job_fini(&j);
        }
    }
    PQclear(r);
    return e;
}

int store_jobs_list(struct db *db, const char *token, const char *state, int limit,
                    void (*cb)(const struct store_job *, void *), void *arg)
{
    char lim[16];
    snprintf(lim, sizeof(lim), "%d", limit);
    const char *v[3] = {token, state, lim};
    return each_job(db, "jobs_list", 3, v, cb, arg);
}

/* Runs a statement that returns (flag, JOB_COLS) for one tenant's job: *flag is the first
 * column. No row means a bad token or no such job for this tenant. */
static int flagged_job(struct db *db, const char *stmt, int n, const char *const *v,
                       const char *token, struct store_job *out, int *flag)
{
    PGresult *r;
    int e = run(db, stmt, n, v, NULL, 0, &r);
    if (e < 0)
        return e;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return read_by(db, "job_get", token, "", out) == STORE_EAUTH ? STORE_EAUTH
                                                                     : STORE_ENOTFOUND;
    }
    *flag = atoi(PQgetvalue(r, 0, 0)) == 1;
    return job_from_row(r, 0, 1, out);
}

int store_resolve(struct db *db, const char *token, const char *job_id, const char *outcome,
                  enum op_state new_state, const char *remote_id, const char *by,
                  struct store_job *out, int *applied)
{
    const char *v[6] = {token, job_id, outcome, st_name(new_state), by, remote_id};
    return flagged_job(db, "resolve", 6, v, token, out, applied);
}

int store_regenerate(struct db *db, const char *token, const char *parent_id, const char *new_id,
                     const char *key, const char *fp_hex, int fp_version, int ttl_hours,
                     struct store_job *out, int *created)
{
    char fpv[16], ttl[16];
    snprintf(fpv, sizeof(fpv), "%d", fp_version);
    snprintf(ttl, sizeof(ttl), "%d", ttl_hours);
    const char *v[7] = {token, parent_id, new_id, key, fp_hex, fpv, ttl};
    for (int tries = 0; tries < 3; tries++) {
        PGresult *r;
        int e = run(db, "regenerate", 7, v, NULL, 0, &r);
        if (e == STORE_ERETRY)
            continue;
        if (e < 0)
            return e;
        if (PQntuples(r) > 0) {
            *created = atoi(PQgetvalue(r, 0, 0)) == 1;
            return job_from_row(r, 0, 1, out);
        }
        PQclear(r);
        /* Nothing inserted and no row with the key: a racing insert, a bad token, or a parent
         * that is not a terminal job of this tenant. */
        e = read_by(db, "by_key", token, key, out);
        if (e == STORE_OK) {
            *created = 0;
            return e;
        }
        if (e == STORE_EAUTH)
            return e;
        struct store_job parent;
        e = read_by(db, "job_get", token, parent_id, &parent);
        if (e == STORE_OK) {
            int terminal = st_is_terminal(parent.state);
            store_job_fini(&parent);
            if (!terminal)
                return STORE_ECONFLICT;
            continue;
        }
        return e;
    }
    return STORE_ERETRY;
}

int store_cancel(struct db *db, const char *token, const char *job_id, struct store_job *out,
                 int *changed)
{
    const char *v[2] = {token, job_id};
    return flagged_job(db, "cancel", 2, v, token, out, changed);
}

int store_webhook(struct db *db, const struct store_webhook_req *w, int *fresh, int *hinted,
                  int *parked)
{
    char hours[24];
    snprintf(hours, sizeof(hours), "%ld", w->window_hours);
    const char *v[6] = {w->provider, w->event_id, w->remote_id, hours, w->is_signed ? "t" : "f",
                        w->client_ref};
    PGresult *r;
    int e = run(db, "webhook", 6, v, NULL, 0, &r);
    if (e < 0)
        return e;
    *fresh = PQgetvalue(r, 0, 0)[0] == 't';
    *hinted = atoi(PQgetvalue(r, 0, 1));
    *parked = PQgetvalue(r, 0, 2)[0] == 't';
    PQclear(r);
    return STORE_OK;
}

int store_resume_polling(struct db *db, const char *job_id, long deadline_ms)
{
    char dl[24];
    snprintf(dl, sizeof(dl), "%ld", deadline_ms);
    const char *v[2] = {job_id, dl};
    PGresult *r;
    int e = run(db, "resume_polling", 2, v, NULL, 0, &r);
    if (e < 0)
        return e;
    e = PQntuples(r) == 1 ? STORE_OK : STORE_ENOTFOUND;
    PQclear(r);
    return e;
}

int store_gauges(struct db *db, void (*cb)(const char *kind, const char *name, long long value,
                                           void *arg),
                 void *arg)
{
    PGresult *r;
    int e = run(db, "gauges", 0, NULL, NULL, 0, &r);
    if (e < 0)
        return e;
    for (int i = 0; i < PQntuples(r); i++)
        cb(PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), atoll(PQgetvalue(r, i, 2)), arg);
    PQclear(r);
    return STORE_OK;
}

int store_admin_jobs_list(struct db *db, const char *state, int limit,
                          void (*cb)(const struct store_job *, void *), void *arg)
{
    char lim[16];
    snprintf(lim, sizeof(lim), "%d", limit);
    const char *v[2] = {state, lim};
    return each_job(db, "admin_jobs_list", 2, v, cb, arg);
}

int store_admin_job_get(struct db *db, const char *job_id, struct store_job *out)
{
    const char *v[1] = {job_id};
    PGresult *r;
    int e = run(db, "admin_job_get", 1, v, NULL, 0, &r);
    if (e < 0)
        return e;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return STORE_ENOTFOUND;
    }
    return job_from_row(r, 0, 1, out);
}

int store_admin_token_of(struct db *db, const char *job_id, char out[65])
{
    const char *v[1] = {job_id};
    PGresult *r;
    int e = run(db, "admin_token_of", 1, v, NULL, 0, &r);
    if (e < 0)
        return e;
    e = PQntuples(r) == 1 ? STORE_OK : STORE_ENOTFOUND;
    if (e == STORE_OK)
        snprintf(out, 65, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return e;
}

int store_janitor(struct db *db, int limit, int *count)
{
    char lim[16];
    snprintf(lim, sizeof(lim), "%d", limit);
    const char *v[1] = {lim};
    PGresult *r;
    int e = run(db, "janitor", 1, v, NULL, 0, &r);
    if (e < 0)
        return e;
    *count = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return STORE_OK;
}
