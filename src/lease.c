#include "idemgate/lease.h"

#include "idemgate/answers.h"
#include "idemgate/backoff.h"
#include "idemgate/clock.h"
#include "idemgate/crypto.h"
#include "idemgate/log.h"
#include "idemgate/store.h"
#include "idemgate/turns.h"
#include "idemgate/upstream.h"
#include "idemgate/wake.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


/* What a worker needs to act on an operation it claimed; read by the CC_ names below. Every claim
 * statement returns these, then one flag of its own (CC_CANCEL_DUE), and the poll's claim one
 * more (CC_POLL_OVERDUE). */
#define CLAIM_COLS                                                                                 \
    "o.tenant_id, o.id, o.lease_version, o.provider, o.route, o.req_method, o.req_url, "          \
    "o.req_credential, o.req_body, extract(epoch FROM o.lease_expires_at - c.at)::float8, "       \
    "o.req_idem_header, o.reconcile_strategy, o.transport_attempts, "                              \
    "(extract(epoch FROM c.at - o.first_sent_at) * 1000)::bigint, o.outputs_requested, "         \
    "o.remote_id, o.poll_url, o.polls, "                                                           \
    DB_EPOCH("coalesce(o.first_sent_at, c.at)") ", " DB_EPOCH("c.at") ", "                      \
    "o.ambiguous_at IS NOT NULL, "                                                                 \
    "(extract(epoch FROM c.at - coalesce(o.ambiguous_at, o.first_sent_at, c.at)) * 1000)::bigint, " \
    "o.cancel_requested_at IS NOT NULL, o.webhook_hint, "                                         \
    "CASE WHEN o.resolution = 'absent' AND o.ambiguous_at > o.resolved_at THEN '' "              \
    " ELSE coalesce(o.resolution, '') END, o.profile_id, o.currency"
enum {
    CC_TENANT, CC_ID, CC_LEASE_VERSION, CC_PROVIDER, CC_ROUTE, CC_METHOD, CC_URL, CC_CREDENTIAL,
    CC_BODY, CC_LEASE_LEFT, CC_IDEM_HEADER, CC_STRATEGY, CC_TRANSPORT, CC_SINCE_FIRST,
    CC_OUT_REQ, CC_REMOTE, CC_POLL_URL, CC_POLLS, CC_FIRST_SENT, CC_NOW, CC_AMBIGUOUS,
    CC_SINCE_AMBIGUOUS, CC_CANCEL_REQ, CC_WEBHOOK_HINT, CC_RESOLUTION, CC_PROFILE, CC_CURRENCY,
    CC_CANCEL_DUE,
    CC_POLL_OVERDUE, CC_CANCEL_ACKED
};

/* Every claim: a new owner ($1), fencing token and lease of $2 seconds of database time, on the
 * one row its pick `c` chose (the most overdue of one tenant's, skipping rows another worker
 * holds). The pick is a MATERIALIZED CTE: run once. As a sub-select in UPDATE … FROM the planner
 * may put it on the inner side of a nested loop and run it again for each outer row, and with
 * SKIP LOCKED each run may pick another row: one claim that moves several (measured on a
 * per-tenant claim: UPDATE 3). The pick also reads the database's clock once (`c.at`, and the
 * lease's end `c.until`): the update and what it returns use these columns, never now() inside
 * CASE, COALESCE or RETURNING, nor timestamp arithmetic on a column (stable, as it depends on the
 * time zone), which Citus refuses even on one shard. */
#define CLAIM_LEASE                                                                                \
    "lease_owner = $1, lease_version = o.lease_version + 1, "                                      \
    "lease_expires_at = c.until, updated_at = c.at "
#define CLAIM_PICK "WITH c AS MATERIALIZED (SELECT now() AS at, now() + make_interval(secs => $2) AS until, "
#define CLAIM_PICKED                                                                               \
    "ORDER BY next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED) "
/* The update names its tenant (a constant, not the pick's column): on a distributed database
 * that is what routes it to the tenant's shard (joined to `c` by tenant, it went to all 32).
 * The row's key is also compared with the pick's as a value (a sub-select of `c`, run once
 * before the scan): the scan is then a lookup of the whole primary key whatever order the plan
 * joins in. Joined only on `o.id = c.id`, a generic plan built while the table was small could put
 * the pick on the inner side and read every row of the tenant (`Index Cond: tenant_id = $4`),
 * each claim slower as the backlog grew (measured on the archive's claim under load: 13–66 ms a
 * claim with 13 853 rows of one tenant). */
#define CLAIM_ON_PICKED(tenant)                                                                    \
    "FROM c WHERE o.tenant_id = " tenant " AND o.id = (SELECT k.id FROM c k) AND o.id = c.id "    \
    "RETURNING " CLAIM_COLS

/* The claim commits `sending` and the new fencing token before any byte leaves: one tenant's
 * ($4) most overdue prepared create, skipping rows another worker holds. Providers whose
 * credential is tripped are skipped: their operations wait in `prepared`. Fair across tenants:
 * turns.h serves the tenants with due creates one claim each in turn. */
static const struct db_stmt claim = {
    .name = "claim",
    .sql = CLAIM_PICK "tenant_id, id FROM operations WHERE tenant_id = $4 "
    "      AND state = 'prepared' AND cancel_requested_at IS NULL AND next_attempt_at <= now() "
    "      AND provider = ANY ($3::text[]) "
    "      AND provider NOT IN (SELECT b.provider FROM provider_breakers b) "
    CLAIM_PICKED "UPDATE operations o SET state = 'sending', " CLAIM_LEASE ", "
    " transport_attempts = o.transport_attempts + 1, "
    " first_sent_at = coalesce(o.first_sent_at, c.at), "
    /* The profile it is sent under ($5: provider → stamp, profile.h): what a later search may
     * prove absent by (reconciler.c, recon_same_reference). */
    " profile_id = coalesce($5::jsonb ->> o.provider, o.profile_id) " CLAIM_ON_PICKED("$4")
    ", false",
    .params = DB_PARAMS("owner", "lease_seconds", "providers", "tenant_id", "stamps"),
    .moves = DB_MOVES({ST_PREPARED, ST_SENDING}),
};

/* The reconciler's claim: one tenant's unknown operation that is due, under a new lease and
 * fencing token; the state stays unknown while it looks. */
static const struct db_stmt reconcile_claim = {
    .name = "reconcile_claim",
    .sql = CLAIM_PICK "tenant_id, id FROM operations WHERE tenant_id = $4 AND state = 'unknown' "
    "      AND next_attempt_at <= now() AND provider = ANY($3::text[]) "
    "      AND (lease_expires_at IS NULL OR lease_expires_at < now()) "
    CLAIM_PICKED "UPDATE operations o SET " CLAIM_LEASE CLAIM_ON_PICKED("$4") ", false",
    .params = DB_PARAMS("owner", "lease_seconds", "providers", "tenant_id"),
    .moves = DB_MOVES({ST_UNKNOWN, ST_UNKNOWN}),
};

/* How long past its poll deadline a job whose cancel was requested is still polled: its cancel
 * sent (an acknowledged cancel was never sent once the deadline passed: the task ran on, billed)
 * and followed to its end; bounded, so that a cancel the provider never answers for good is not
 * sent every poll interval for ever. */
#define CANCEL_FOLLOWED_S "3600"
/* The poller's claim: one tenant's accepted operation due for a status read, under a new lease
 * and fencing token; with its cancel to send first when one was requested and not yet answered
 * (a client's cancel makes the row due at once: idemgate_cancel). The cancel is marked sent only
 * once the provider answered it for good (poll_cancel_sent): a cancel that failed, or whose
 * replica died, is sent again by the next poll. A job past its poll deadline is read once more
 * and flagged `overdue`: a read that does not show the task's end sends it to `review`
 * (invariant 2: every accepted job ends or reaches an operator) — unless a cancel was requested
 * within CANCEL_FOLLOWED_S, which is followed to the task's end first. */
/* Only the providers this replica polls ($P, a text[]): another replica's are left to it. */
#define POLL_DUE(P)                                                                                \
    "state = 'accepted' AND next_attempt_at <= now() AND provider = ANY (" P "::text[]) "          \
    "AND (lease_expires_at IS NULL OR lease_expires_at < now()) "
static const struct db_stmt poll_claim = {
    .name = "poll_claim",
    .sql = CLAIM_PICK "tenant_id, id, "
    "      (cancel_requested_at IS NOT NULL AND cancel_sent_at IS NULL) AS cancel_due, "
    "      (poll_deadline_at <= now() AND NOT coalesce(cancel_requested_at > now() - "
    "       interval '" CANCEL_FOLLOWED_S " seconds', false)) IS TRUE AS overdue, "
    "      cancel_acknowledged "
    "      FROM operations WHERE tenant_id = $4 AND " POLL_DUE("$3")
    CLAIM_PICKED "UPDATE operations o SET " CLAIM_LEASE ", polls = o.polls + 1 "
    CLAIM_ON_PICKED("$4") ", c.cancel_due, c.overdue, c.cancel_acknowledged",
    .params = DB_PARAMS("owner", "lease_seconds", "providers", "tenant_id"),
    .moves = DB_MOVES({ST_ACCEPTED, ST_ACCEPTED}),
};

/* The cancel a poll sent was answered for good (policy.h, pol_cancel_answered), or cannot be sent
 * at all (the profile has no cancel): not sent again. Under the poll's own claim. $4: whether the
 * provider acknowledged it (2xx, migration 0043: a later poll reads a deleted task by it). */
static const struct db_stmt poll_cancel_sent = {
    .name = "poll_cancel_sent",
    .sql = "UPDATE operations SET cancel_sent_at = now(), cancel_acknowledged = $4::boolean "
    "WHERE tenant_id = $1 AND id = $2 AND lease_version = $3 AND " KEYED_STATE("state")
    " = 'accepted' AND cancel_requested_at IS NOT NULL AND cancel_sent_at IS NULL",
    .params = DB_PARAMS("tenant_id", "id", "lease_version", "acknowledged"),
    .moves = DB_MOVES({ST_ACCEPTED, ST_ACCEPTED}),
};

/* The tenants with due work of each kind (turns.h): one row per tenant. */
#define CLAIM_DUE                                                                                  \
    "state = 'prepared' AND cancel_requested_at IS NULL AND next_attempt_at <= now() "            \
    "AND provider = ANY ($1::text[]) "                                                             \
    "AND provider NOT IN (SELECT b.provider FROM provider_breakers b)"
static const struct db_stmt claim_due = {
    .rerun_safe = 1,
    .name = "claim_due",
    .sql = TURNS_DUE("operations", CLAIM_DUE),
    .sql_distributed = TURNS_DUE_DISTRIBUTED("operations", CLAIM_DUE),
    .params = DB_PARAMS("providers"),
};
#define RECONCILE_DUE                                                                              \
    "state = 'unknown' AND next_attempt_at <= now() AND provider = ANY ($1::text[]) "             \
    "AND (lease_expires_at IS NULL OR lease_expires_at < now())"
static const struct db_stmt reconcile_due = {
    .rerun_safe = 1,
    .name = "reconcile_due",
    .sql = TURNS_DUE("operations", RECONCILE_DUE),
    .sql_distributed = TURNS_DUE_DISTRIBUTED("operations", RECONCILE_DUE),
    .params = DB_PARAMS("providers"),
};
static const struct db_stmt poll_due = {
    .rerun_safe = 1,
    .name = "poll_due",
    .sql = TURNS_DUE("operations", POLL_DUE("$1")),
    .sql_distributed = TURNS_DUE_DISTRIBUTED("operations", POLL_DUE("$1")),
    .params = DB_PARAMS("providers"),
};
static const struct db_stmt reap_due = {
    .rerun_safe = 1,
    .name = "reap_due",
    .sql = "SELECT tenant_id FROM operations WHERE state = 'sending' "
    " AND lease_expires_at < now() GROUP BY tenant_id",
};

/* A transport retry under the same provider idempotency key: unknown → sending, under the lease
 * the reconciler holds. */
static const struct db_stmt reconcile_send = {
    .name = "reconcile_send",
    .sql = "UPDATE operations SET state = 'sending', transport_attempts = transport_attempts + 1, "
    " lease_expires_at = now() + make_interval(secs => $4), updated_at = now(), "
    " profile_id = coalesce($5::text, profile_id) "
    "WHERE tenant_id = $1 AND id = $2 AND lease_version = $3 AND " KEYED_STATE("state")
    " = 'unknown' "
    " AND cancel_requested_at IS NULL "
    "RETURNING extract(epoch FROM lease_expires_at - updated_at)::float8",
    .params = DB_PARAMS("tenant_id", "id", "lease_version", "lease_seconds", "stamp"),
    .moves = DB_MOVES({ST_UNKNOWN, ST_SENDING}),
};

/* The SET list of a result's write, once for both texts: P(n, name, type) names parameter n of
 * the single-row text ($n) or the batch's column of it (j.p_name). */
#define FP_POS(n, name, type) "$" #n "::" #type
#define FP_ROW(n, name, type) "j.p_" #name "::" #type
/* A create whose task a signed webhook named while it was in flight (webhook_signed keeps the
 * hint on the `sending` row) never ends `prepared` or `failed` on its own answer: the provider
 * said a task exists (a back-off or a refusal that came after it made the task). It ends
 * `unknown`, ambiguous, and is reconciled by the hint at once — never sent again, never failed
 * while its task exists. */
#define FINISH_HINTED(P)                                                                           \
    "(" P(17, kind, text) " = 'create' AND " P(4, state, text) " IN ('prepared', 'failed') "      \
    " AND webhook_hint IS NOT NULL)"
/* A poll that would send its job to review at the deadline, when a cancel, a verified webhook
 * or the admin's resume made the row due again while it read (each moves the next attempt past
 * the claim's instant): the job stays accepted for the poll that follows (the cancel is sent, the
 * webhook's change read, the resume's new deadline polled) — never review over them. */
#define FINISH_DUE_AGAIN(P)                                                                        \
    "(" P(17, kind, text) " = 'poll' AND " P(4, state, text) " = 'review' "                       \
    " AND next_attempt_at >= updated_at)"
#define FINISH_SET(P)                                                                              \
    " state = CASE WHEN " FINISH_HINTED(P) " THEN 'unknown' "                                     \
    "  WHEN " FINISH_DUE_AGAIN(P) " THEN 'accepted' "                                              \
    "  WHEN " P(4, state, text) " = 'prepared' AND cancel_requested_at IS NOT NULL "              \
    "  THEN CASE WHEN " P(25, may_have_created, boolean) " OR ambiguous_at IS NOT NULL "           \
    "   THEN 'unknown' ELSE 'failed' END "                                                         \
    "  ELSE " P(4, state, text) " END, "                                                           \
    " resp_status = coalesce(" P(5, http_status, integer) ", resp_status), "                       \
    " resp_headers = coalesce(" P(6, resp_headers, jsonb) ", resp_headers), "                      \
    " resp_body = coalesce(" P(7, resp_body, bytea) ", resp_body), "                               \
    " last_error = CASE WHEN " FINISH_HINTED(P) " THEN 'a signed webhook named a task of this "   \
    "job while it was sent: reconciled by it, never sent again' "                                  \
    "  WHEN " FINISH_DUE_AGAIN(P) " THEN last_error "                                              \
    "  WHEN " P(4, state, text) " = 'prepared' AND cancel_requested_at IS "                        \
    "NOT NULL "                                                                                    \
    "  THEN CASE WHEN " P(25, may_have_created, boolean) " OR ambiguous_at IS NOT NULL "           \
    "   THEN 'canceled; not sent again (an attempt may have made the task: reconciliation "        \
    "decides)' ELSE 'canceled; not sent again' END "                                               \
    "  ELSE " P(8, error, text) " END, "                                                           \
    " remote_id = coalesce(" P(9, remote_id, text) ", remote_id), "                                \
    " lease_owner = NULL, lease_expires_at = NULL, updated_at = now(), "                           \
    " next_attempt_at = CASE WHEN " P(17, kind, text) " = 'poll' AND " P(4, state, text) " "       \
    "= 'accepted' "                                                                                \
    "   AND next_attempt_at >= updated_at "                                                        \
    "  THEN least(next_attempt_at, now() + make_interval(secs => "                                 \
    P(15, retry_delay_ms, float8) " / 1000)) "                                                     \
    "  WHEN " P(17, kind, text) " = 'create' "                                                    \
    "   AND " P(4, state, text) " IN ('unknown', 'prepared', 'failed') "                          \
    "   AND webhook_hint IS NOT NULL THEN now() "                                                  \
    "  ELSE now() + make_interval(secs => " P(15, retry_delay_ms, float8) " / 1000) END, "         \
    " outputs_received = coalesce(" P(18, outputs_received, integer) ", outputs_received), "       \
    " outputs_requested = coalesce(" P(19, outputs_requested, integer) ", outputs_requested), "    \
    " usage = coalesce(" P(20, usage, jsonb) ", usage), "                                          \
    " poll_url = coalesce(" P(21, poll_url, text) ", poll_url), "                                  \
    " poll_deadline_at = coalesce(now() + make_interval(secs => "                                  \
    P(22, poll_deadline_ms, bigint) "::float8 / 1000), "                                           \
    "  poll_deadline_at), "                                                                        \
    " provider_status = coalesce(" P(23, provider_status, text) ", provider_status), "             \
    " outputs = coalesce(" P(24, outputs, jsonb) ", outputs), "                                    \
    " ambiguous_at = CASE WHEN " P(25, may_have_created, boolean) " OR "                           \
    "(" P(17, kind, text) " = 'create' AND " P(4, state, text) " = 'unknown') OR "                 \
    FINISH_HINTED(P)                                                                               \
    "  THEN now() ELSE ambiguous_at END, "                                                         \
    " webhook_hint = CASE WHEN " P(17, kind, text) " = 'reconcile' AND "                            \
    P(12, outcome, text) " IS DISTINCT FROM 'hint_unread' THEN NULL ELSE webhook_hint END, "      \
    " cost_micros = CASE WHEN operations.state IN ('completed', 'failed', 'canceled') "            \
    "   THEN coalesce(" P(26, cost_micros, bigint) ", cost_micros) "                               \
    "  WHEN " FINISH_HINTED(P) " THEN cost_micros "                                                \
    "  WHEN " P(4, state, text) " IN ('completed', 'canceled') "                                   \
    "   THEN coalesce(" P(26, cost_micros, bigint) ", cost_micros, reserved_micros) "              \
    "  WHEN " P(4, state, text) " = 'failed' OR (" P(4, state, text) " = 'prepared' AND "          \
    "cancel_requested_at IS NOT NULL "                                                             \
    "   AND NOT (" P(25, may_have_created, boolean) " OR ambiguous_at IS NOT NULL)) THEN 0 "       \
    "  ELSE coalesce(" P(26, cost_micros, bigint) ", cost_micros) END, "                           \
    " finished_at = CASE WHEN " FINISH_HINTED(P) " THEN NULL "                                     \
    "  WHEN " P(4, state, text) " IN ('completed', 'failed', 'canceled') "                         \
    "   OR (" P(4, state, text) " = 'prepared' AND cancel_requested_at IS NOT NULL "               \
    "    AND NOT (" P(25, may_have_created, boolean) " OR ambiguous_at IS NOT NULL)) THEN "        \
    "now() END, "                                                                                  \
    " archive_planned_at = CASE WHEN " P(27, archive_plan, jsonb) " IS NOT NULL AND "              \
    P(4, state, text) " = 'completed' "                                                            \
    "  THEN now() ELSE archive_planned_at END "

/* A result is written only under the lease that sent it (fencing) — also once the reaper has
 * made that lease's row `unknown`, as long as nobody claimed it since (the same token, unowned:
 * the reaper never bumps the token, every claim does); the attempt is recorded
 * whatever happens, as 'fenced' when the write was dropped. A cancelled operation that would go
 * back to prepared is failed instead, or unknown when an attempt may have made its task (never
 * failed on a guess: invariant 8, a failed operation has no task). A terminal state written
 * settles a budgeted operation's budget row; a completed result written with its outputs' archive
 * plan is marked planned and its archive rows inserted. Returns "<decision> <state written>"
 * ("fenced " when fenced). A fenced write records its attempt only while the operation exists,
 * under FOR KEY SHARE as the foreign key did before migration 0030 (a janitor deleting it is
 * waited for): a result back after its job was deleted leaves nothing.
 * Its moves are declared here and checked before it runs (finish_move_ok).
 *
 * Two texts of one write. On PostgreSQL, one statement: the update, the settle, the plan and the
 * attempt row as data-modifying CTEs (issue 23: 18 µs of a job's ~175 µs executor time less than
 * the PL/pgSQL function, one client, measured 2026-12-04). On a distributed database, the
 * per-tenant function (migrations 0019–0030), which Citus runs on the tenant's worker: an INSERT
 * inside a CTE is never router-planned there. Both write the same rows, column for column
 * (test_group_commit.py::test_the_plain_finish_writes_what_the_function_writes). */
#define FINISH_PLAIN_SQL                                                                        \
    "WITH u AS (UPDATE operations SET " FINISH_SET(FP_POS)                                      \
    " WHERE tenant_id = $1::bigint AND id = $2::text AND lease_version = $3::bigint "           \
    "  AND (" KEYED_STATE("operations.state") " = $16::text "                                   \
    "   OR ($16::text = 'sending' AND " KEYED_STATE("operations.state") " = 'unknown' "         \
    "    AND operations.lease_owner IS NULL AND operations.lease_expires_at IS NOT NULL)) "     \
    " RETURNING operations.state, operations.budgeted, operations.currency, "                  \
    "  operations.cost_micros, operations.reserved_micros, operations.created_at, "             \
    "  operations.provider), "                                                                  \
    "b AS (UPDATE tenant_budgets b SET inflight = greatest(b.inflight - 1, 0), "               \
    " day_micros = CASE WHEN b.day = (u.created_at AT TIME ZONE 'UTC')::date "                  \
    "   AND b.currency = u.currency "                                                           \
    "  THEN greatest(b.day_micros + (u.cost_micros - u.reserved_micros), 0) "                   \
    "  ELSE b.day_micros END, "                                                                 \
    " month_micros = CASE WHEN b.month = date_trunc('month', u.created_at AT TIME ZONE 'UTC')::date " \
    "   AND b.currency = u.currency "                                                           \
    "  THEN greatest(b.month_micros + (u.cost_micros - u.reserved_micros), 0) "                 \
    "  ELSE b.month_micros END, "                                                               \
    " updated_at = now() "                                                                      \
    " FROM u WHERE b.tenant_id = $1::bigint AND u.budgeted "                                    \
    "  AND u.state IN ('completed', 'failed', 'canceled')), "                                   \
    "p AS (INSERT INTO archive_outputs (tenant_id, op_id, n, provider, kind, source_url, "     \
    "  credential, expires_at, lease_owner, lease_version, lease_expires_at, attempts, state, " \
    "  last_error) "                                                                            \
    " SELECT $1::bigint, $2::text, x.n, u.provider, x.kind, x.url, x.credential, "              \
    "  CASE WHEN x.expires > 0 THEN to_timestamp(x.expires) END, x.owner, "                     \
    "  CASE WHEN x.owner IS NULL THEN 0 ELSE 1 END, now() + make_interval(secs => x.lease), "   \
    "  CASE WHEN x.owner IS NULL THEN 0 ELSE 1 END, coalesce(x.state, 'pending'), x.error "     \
    " FROM u, jsonb_to_recordset($27::jsonb) "                                                  \
    "  AS x(n integer, kind text, url text, credential text, expires float8, owner text, "      \
    "   lease float8, state text, error text) "                                                 \
    " WHERE u.state = 'completed' ON CONFLICT DO NOTHING "                                      \
    " RETURNING n, lease_owner IS NOT NULL AS born), "                                          \
    "a AS (INSERT INTO attempts (tenant_id, operation_id, lease_version, kind, started_at, "   \
    "  finished_at, outcome, http_status, curl_code, bytes_sent, decision, error) "             \
    " SELECT $1::bigint, $2::text, $3::bigint, $17::text, to_timestamp($10::float8), "          \
    "  to_timestamp($11::float8), $12::text, $5::integer, $13::integer, $14::bigint, "          \
    "  coalesce((SELECT $4::text FROM u), 'fenced'), $8::text "                                \
    " WHERE EXISTS (SELECT 1 FROM u) OR EXISTS (SELECT 1 FROM operations "                      \
    "  WHERE tenant_id = $1::bigint AND id = $2::text FOR KEY SHARE)) "                         \
    "SELECT coalesce((SELECT $4::text || ' ' || u.state FROM u), 'fenced '), "                 \
    " (SELECT string_agg(p.n::text, ',') FROM p WHERE p.born)"
#define FINISH_PARAMS                                                                          \
    DB_PARAMS("tenant_id", "id", "lease_version", "state", "http_status", "resp_headers",          \
              "resp_body", "error", "remote_id", "started_at", "finished_at", "outcome",           \
              "curl_code", "bytes_sent", "retry_delay_ms", "from", "kind", "outputs_received",     \
              "outputs_requested", "usage", "poll_url", "poll_deadline_ms", "provider_status",     \
              "outputs", "may_have_created", "cost_micros", "archive_plan")
/* A create's outcome (dispatch, or a resend under the reconciler's lease); a reconcile's verdict
 * (not yet, absent, found, escalated, cancelled); a poll: still running, or the task's end
 * (canceled: ended by the provider on our cancel). */
#define FINISH_MOVES                                                                           \
    DB_MOVES({ST_SENDING, ST_PREPARED}, {ST_SENDING, ST_ACCEPTED}, {ST_SENDING, ST_UNKNOWN},       \
             {ST_SENDING, ST_COMPLETED}, {ST_SENDING, ST_FAILED}, {ST_UNKNOWN, ST_UNKNOWN},        \
             {ST_UNKNOWN, ST_PREPARED}, {ST_UNKNOWN, ST_ACCEPTED}, {ST_UNKNOWN, ST_COMPLETED},     \
             {ST_UNKNOWN, ST_REVIEW}, {ST_UNKNOWN, ST_FAILED}, {ST_ACCEPTED, ST_ACCEPTED},         \
             {ST_ACCEPTED, ST_COMPLETED}, {ST_ACCEPTED, ST_FAILED}, {ST_ACCEPTED, ST_CANCELED},     \
             {ST_ACCEPTED, ST_REVIEW})
static const struct db_stmt finish = {
    .name = "finish",
    .sql = FINISH_PLAIN_SQL,
    .sql_distributed = "SELECT idemgate_finish($1::bigint, $2::text, $3::bigint, $4::text, "
    "$5::integer, $6::jsonb, $7::bytea, $8::text, $9::text, $10::float8, $11::float8, $12::text, "
    "$13::integer, $14::bigint, $15::float8, $16::text, $17::text, $18::integer, $19::integer, "
    "$20::jsonb, $21::text, $22::bigint, $23::text, $24::jsonb, $25::boolean, $26::bigint, "
    "$27::jsonb)",
    .params = FINISH_PARAMS,
    .moves = FINISH_MOVES,
};

/* finish for a batch of results, one statement (db_run_rows): the same SET list over the rows'
 * arrays, their outputs' archive rows and attempt rows. A row whose operation has a budget, or
 * whose write is fenced, is left alone and answers nothing: it is then written by `finish`, which
 * settles the budget and records a fenced attempt (a budget settled by many rows at once would
 * clamp its totals at zero once where the single writes clamp each). */
static const struct db_stmt finish_rows = {
    .name = "finish_rows",
    .sql = "WITH u AS (UPDATE operations SET " FINISH_SET(FP_ROW)
    " FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], "
    "  $7::bytea[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], "
    "  $14::text[], $15::text[], $16::text[], $17::text[], $18::text[], $19::text[], $20::text[], "
    "  $21::text[], $22::text[], $23::text[], $24::text[], $25::text[], $26::text[], $27::text[]) "
    " WITH ORDINALITY AS j(p_tenant_id, p_id, p_lease_version, p_state, p_http_status, "
    "  p_resp_headers, p_resp_body, p_error, p_remote_id, p_started_at, p_finished_at, p_outcome, "
    "  p_curl_code, p_bytes_sent, p_retry_delay_ms, p_from, p_kind, p_outputs_received, "
    "  p_outputs_requested, p_usage, p_poll_url, p_poll_deadline_ms, p_provider_status, "
    "  p_outputs, p_may_have_created, p_cost_micros, p_archive_plan, n) "
    " WHERE " DB_ROWS_FEW("j.n") " AND operations.tenant_id = j.p_tenant_id::bigint "
    "  AND operations.id = j.p_id AND operations.lease_version = j.p_lease_version::bigint "
    "  AND " KEYED_STATE("operations.state") " = j.p_from AND NOT operations.budgeted "
    " RETURNING j.n, operations.tenant_id, operations.id, operations.state, operations.provider, "
    "  j.p_lease_version, j.p_state, j.p_kind, j.p_started_at, j.p_finished_at, j.p_outcome, "
    "  j.p_http_status, j.p_curl_code, j.p_bytes_sent, j.p_error, j.p_archive_plan), "
    "p AS (INSERT INTO archive_outputs (tenant_id, op_id, n, provider, kind, source_url, "
    "  credential, expires_at, lease_owner, lease_version, lease_expires_at, attempts, state, "
    "  last_error) "
    " SELECT u.tenant_id, u.id, x.n, u.provider, x.kind, x.url, x.credential, "
    "  CASE WHEN x.expires > 0 THEN to_timestamp(x.expires) END, x.owner, "
    "  CASE WHEN x.owner IS NULL THEN 0 ELSE 1 END, now() + make_interval(secs => x.lease), "
    "  CASE WHEN x.owner IS NULL THEN 0 ELSE 1 END, coalesce(x.state, 'pending'), x.error "
    " FROM u, jsonb_to_recordset(u.p_archive_plan::jsonb) "
    "  AS x(n integer, kind text, url text, credential text, expires float8, owner text, "
    "   lease float8, state text, error text) "
    " WHERE u.state = 'completed' ON CONFLICT DO NOTHING "
    " RETURNING op_id, n, lease_owner IS NOT NULL AS born), "
    "a AS (INSERT INTO attempts (tenant_id, operation_id, lease_version, kind, started_at, "
    "  finished_at, outcome, http_status, curl_code, bytes_sent, decision, error) "
    " SELECT u.tenant_id, u.id, u.p_lease_version::bigint, u.p_kind, "
    "  to_timestamp(u.p_started_at::float8), to_timestamp(u.p_finished_at::float8), u.p_outcome, "
    "  u.p_http_status::integer, u.p_curl_code::integer, u.p_bytes_sent::bigint, u.p_state, "
    "  u.p_error FROM u) "
    "SELECT u.n, u.p_state || ' ' || u.state, "
    " (SELECT string_agg(p.n::text, ',') FROM p WHERE p.born AND p.op_id = u.id) FROM u",
    .params = FINISH_PARAMS,
    .moves = FINISH_MOVES,
};

/* After a fenced write was re-run on a new connection: whether the first run had committed (the
 * row holds what it wrote, under the same fencing token, unowned), and the state it wrote. Reads
 * only. */
static const struct db_stmt finish_check = {
    .rerun_safe = 1,
    .name = "finish_check",
    .sql = "SELECT state FROM operations WHERE tenant_id = $1 AND id = $2 AND lease_version = $3 "
    " AND lease_owner IS NULL "
    " AND (state = $4 OR ($4 IN ('prepared', 'failed') AND state IN ('failed', 'unknown')) "
    "  OR ($4 = 'review' AND state = 'accepted'))",
    .params = DB_PARAMS("tenant_id", "id", "lease_version", "state"),
};

/* Nobody can know whether a dead worker's bytes left: expired `sending` leases become unknown,
 * never prepared. The reconciler first looks REAP_GRACE_S later: a live worker whose result
 * write waited for the database (finish_run) writes it there first, under the same token (the
 * finish above) — a result held is never traded for a reconciliation that may only end in
 * review. Absence is concluded later still (absent_grace_ms, 30 s by default). The expired
 * lease's end is kept: it marks the row as reaped (every finish clears it), so a finish run
 * again after its own commit is not applied a second time there. */
#define REAP_GRACE_N 10
#define REAP_GRACE_STR_(x) #x
#define REAP_GRACE_STR(x) REAP_GRACE_STR_(x)
#define REAP_GRACE_S REAP_GRACE_STR(REAP_GRACE_N)
static const struct db_stmt reap = {
    .name = "reap",
    .sql = "WITH c AS MATERIALIZED (SELECT tenant_id, id FROM operations WHERE tenant_id = $2 "
    "       AND state = 'sending' AND lease_expires_at < now() ORDER BY lease_expires_at LIMIT $1 "
    "       FOR UPDATE SKIP LOCKED), "
    "r AS (UPDATE operations o SET state = 'unknown', lease_owner = NULL, "
    "  updated_at = now(), "
    "  next_attempt_at = now() + make_interval(secs => " REAP_GRACE_S "), ambiguous_at = now(), "
    "  last_error = 'lease expired while sending' "
    " FROM c WHERE o.tenant_id = $2 AND o.id = ANY (ARRAY(SELECT k.id FROM c k)) AND o.id = c.id "
    " RETURNING o.tenant_id, o.id, o.lease_version) "
    "INSERT INTO attempts (tenant_id, operation_id, lease_version, kind, outcome, decision, "
    " error) "
    "SELECT tenant_id, id, lease_version, 'create', 'lease_expired', 'unknown', "
    " 'lease expired while sending' FROM r RETURNING operation_id",
    .params = DB_PARAMS("limit", "tenant_id"),
    .moves = DB_MOVES({ST_SENDING, ST_UNKNOWN}),
};

void store_claim_fini(struct store_claim *c)
{
    PQclear(c->res);
    free(c->own);
    free(c->body);
    memset(c, 0, sizeof(*c));
}

static int flag(const PGresult *r, int col)
{
    return PQgetvalue(r, 0, col)[0] == 't';
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
    out->idem_header = db_val(r, 0, CC_IDEM_HEADER);
    out->reconcile_strategy = PQgetvalue(r, 0, CC_STRATEGY);
    int strategy = prof_reconcile_parse(out->reconcile_strategy);
    out->strategy = strategy < 0 ? RECON_NONE : (enum cfg_reconcile)strategy;
    out->transport_attempts = atoi(PQgetvalue(r, 0, CC_TRANSPORT));
    out->since_first_ms = db_val(r, 0, CC_SINCE_FIRST) ? atoll(db_val(r, 0, CC_SINCE_FIRST)) : 0;
    out->outputs_requested = db_val(r, 0, CC_OUT_REQ) ? atoi(db_val(r, 0, CC_OUT_REQ)) : -1;
    out->remote_id = db_val(r, 0, CC_REMOTE);
    out->poll_url = db_val(r, 0, CC_POLL_URL);
    out->polls = atoi(PQgetvalue(r, 0, CC_POLLS));
    out->first_sent_db = atof(PQgetvalue(r, 0, CC_FIRST_SENT));
    out->now_db = atof(PQgetvalue(r, 0, CC_NOW));
    out->ambiguous_before = flag(r, CC_AMBIGUOUS);
    out->since_ambiguous_ms = atoll(PQgetvalue(r, 0, CC_SINCE_AMBIGUOUS));
    out->cancel_requested = flag(r, CC_CANCEL_REQ);
    out->webhook_hint = db_val(r, 0, CC_WEBHOOK_HINT);
    out->profile_stamp = db_val(r, 0, CC_PROFILE);
    out->currency = db_val(r, 0, CC_CURRENCY);
    out->operator_found = strcmp(PQgetvalue(r, 0, CC_RESOLUTION), "found") == 0;
    out->operator_absent = strcmp(PQgetvalue(r, 0, CC_RESOLUTION), "absent") == 0;
    out->cancel_due = flag(r, CC_CANCEL_DUE);
    out->poll_overdue = PQnfields(r) > CC_POLL_OVERDUE && flag(r, CC_POLL_OVERDUE);
    out->cancel_acknowledged = PQnfields(r) > CC_CANCEL_ACKED && flag(r, CC_CANCEL_ACKED);
    if (db_bytea_decode(db_val(r, 0, CC_BODY), &out->body, &out->body_len) < 0) {
        store_claim_fini(out);
        return STORE_EINTERNAL;
    }
    return STORE_OK;
}

static int claim_from_run(int e, PGresult *r, struct store_claim *out)
{
    if (e < 0)
        return e;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return STORE_ENOTFOUND;
    }
    return claim_from(r, out);
}

/* Unix seconds of a job timestamp ("YYYY-MM-DDTHH:MM:SS.ffffffZ", UTC); 0 when absent. */
static double job_time(const char *ts)
{
    struct tm tm = {0};
    int us = 0;
    if (!ts || sscanf(ts, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                      &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &us) != 7)
        return 0;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (double)timegm(&tm) + us / 1e6;
}

/* Copies the strings a claim points at into one allocation. */
static int own_strings(struct store_claim *c, const char **const *fields, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += *fields[i] ? strlen(*fields[i]) + 1 : 0;
    char *p = c->own = malloc(total ? total : 1);
    if (!p)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (!*fields[i])
            continue;
        size_t len = strlen(*fields[i]) + 1;
        memcpy(p, *fields[i], len);
        *fields[i] = p;
        p += len;
    }
    return 0;
}

int lease_is_born(const struct store_intake_req *q, const struct store_job *j)
{
    /* Fencing token 1 on a prepared row: the reservation the intake statement made (a row for
     * any replica is recorded with 0; a cancel moves it to failed). */
    return q->claim_owner && j->state == ST_PREPARED && j->lease_version == 1;
}

int lease_claim_born(const struct store_intake_req *q, const struct store_job *j,
                     struct store_claim *c)
{
    memset(c, 0, sizeof(*c));
    *c = (struct store_claim){.tenant_id = j->tenant_id,
                              .id = j->id,
                              .lease_version = j->lease_version,
                              .provider = j->provider,
                              .route = j->route,
                              .method = q->method,
                              .url = q->url,
                              .credential = q->credential,
                              .lease_remaining_s = q->lease_seconds,
                              .idem_header = q->idem_header,
                              .reconcile_strategy = q->reconcile_strategy,
                              .outputs_requested = q->outputs_requested,
                              .first_sent_db = job_time(j->created_at),
                              .now_db = job_time(j->created_at),
                              .born = 1};
    int strategy = prof_reconcile_parse(q->reconcile_strategy);
    c->strategy = strategy < 0 ? RECON_NONE : (enum cfg_reconcile)strategy;
    const char **const fields[] = {&c->id,  &c->provider,   &c->route,
                                   &c->method, &c->url,     &c->credential,
                                   &c->idem_header, &c->reconcile_strategy};
    c->body = malloc(q->body_len + 1);
    if (!c->body || own_strings(c, fields, sizeof(fields) / sizeof(fields[0])) < 0) {
        store_claim_fini(c);
        return -1;
    }
    memcpy(c->body, q->body, q->body_len);
    c->body[q->body_len] = '\0';
    c->body_len = q->body_len;
    return 0;
}

/* One ring per kind of claim in this process (turns.h). */
static struct turns claim_turns = TURNS_INIT, reconcile_turns = TURNS_INIT,
                    poll_turns = TURNS_INIT, reap_turns = TURNS_INIT;

/* One kind's claim: its statements and arguments. */
struct claim_kind {
    const struct db_stmt *due, *claim;
    const char *owner;
    int lease_seconds;
    const char *providers; /* NULL: the statements name no providers */
    const char *stamps;    /* the dispatcher's claim: each provider's profile stamp (JSON) */
    struct store_claim *out;
    int lost_is_unsent; /* a claim whose answer was lost is given back (claim_lost) */
};

/* A dispatcher's claim whose answer was lost (its connection died during the statement's
 * COMMIT) may have committed: its row `sending` under a lease and a fencing token nobody holds,
 * with nothing sent. Left so, the lease ends, the reaper makes it `unknown` — an ambiguous send
 * that never happened, sent to review by a profile that cannot look a task up. Every claim names
 * itself (the owner gets a random suffix of its own), so the row such a claim moved, and only
 * it, is written back to `prepared`: never sent, due at once — or, when its cancel was
 * acknowledged meanwhile, cancelled as a job never sent (`failed` at cost 0, or `unknown` after
 * an earlier attempt that may have made its task; migration 0037). A row the reaper or another
 * replica has taken since is no longer `sending` under that name, and one a signed webhook
 * hinted meanwhile (a task of this job exists: the reaper's `unknown` and its reader decide), are
 * left alone. Each row answers its id and the state written. */
static const struct db_stmt claim_lost = {
    .name = "claim_lost",
    .sql = "SELECT job_id, job_state FROM idemgate_claim_lost($1::bigint, $2::text)",
    .params = DB_PARAMS("tenant_id", "owner"),
    .moves = DB_MOVES({ST_SENDING, ST_PREPARED}, {ST_SENDING, ST_FAILED},
                      {ST_SENDING, ST_UNKNOWN}),
};

/* The names of claims whose answer was lost after the statement may have reached the server,
 * each given back at once and again — by a later claim, 1 s after, then up to 30 s apart — until
 * its row was found or its lease has ended as far as this replica can tell (the database may
 * commit the claim after the first give-back ran: a connection cut by a partition, not by the
 * server; one that commits later still is reaped to `unknown`, as before). Bounded: past it, the
 * one whose lease ends first is left to it. */
#define LOST_CLAIMS_MAX 32
#define CLAIM_NAME_MAX 320
struct lost_claim {
    long long tenant;
    double until;    /* clock_mono() after which its lease has ended: nothing left to give back */
    double next_try; /* clock_mono() of its next try (1 s, then doubling up to 30 s apart) */
    double gap;      /* seconds between its last try and the next */
    char owner[CLAIM_NAME_MAX];
};
static struct {
    pthread_mutex_t mu;
    size_t n;
    struct lost_claim v[LOST_CLAIMS_MAX];
} g_lost = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Gives back what the claim named owner moved for tenant: 1 when it found the row, 0 when it
 * found none, -1 when it could not run. */
static int give_back_lost(struct db *db, long long tenant, const char *owner)
{
    PGresult *r;
    int e = db_run(db, &claim_lost, DB_ARGS(p_int("tenant_id", tenant), p_text("owner", owner)),
                   &r);
    if (e < 0)
        return -1;
    int found = PQntuples(r) > 0;
    for (int i = 0; i < PQntuples(r); i++) {
        int st = st_parse(PQgetvalue(r, i, 1));
        LOG(LOG_WARN, "claim_given_back", LS("job_id", PQgetvalue(r, i, 0)),
            LS("state", PQgetvalue(r, i, 1)),
            LS("note", st == ST_PREPARED
                           ? "the claim's answer was lost: never sent, prepared again and due now"
                           : "the claim's answer was lost: never sent, and its cancel was "
                             "acknowledged meanwhile: cancelled as a job never sent"));
        if (st >= 0)
            wake_state(PQgetvalue(r, i, 0), (enum op_state)st);
    }
    PQclear(r);
    return found;
}

static void keep_lost(const struct lost_claim *c)
{
    pthread_mutex_lock(&g_lost.mu);
    if (g_lost.n == LOST_CLAIMS_MAX) { /* the one whose lease ends first is left to it */
        size_t old = 0;
        for (size_t i = 1; i < g_lost.n; i++)
            if (g_lost.v[i].until < g_lost.v[old].until)
                old = i;
        LOG(LOG_WARN, "claim_lost_kept", LS("owner", g_lost.v[old].owner),
            LS("note", "too many claims to give back: this one ends with its lease"));
        g_lost.v[old] = g_lost.v[--g_lost.n];
    }
    g_lost.v[g_lost.n++] = *c;
    pthread_mutex_unlock(&g_lost.mu);
}

static void lost_claim(struct db *db, long long tenant, const char *owner, int lease_seconds)
{
    double now = clock_mono();
    struct lost_claim c = {
        .tenant = tenant, .until = now + lease_seconds + 5.0, .next_try = now + 1.0, .gap = 1.0};
    snprintf(c.owner, sizeof(c.owner), "%s", owner);
    if (give_back_lost(db, tenant, owner) <= 0)
        keep_lost(&c);
}

/* The give-backs still owed, each tried once (outside the lock); kept until found or over. */
static void retry_lost(struct db *db)
{
    pthread_mutex_lock(&g_lost.mu);
    size_t n = g_lost.n;
    pthread_mutex_unlock(&g_lost.mu);
    for (size_t i = 0; i < n; i++) {
        struct lost_claim c;
        pthread_mutex_lock(&g_lost.mu);
        if (!g_lost.n) {
            pthread_mutex_unlock(&g_lost.mu);
            return;
        }
        c = g_lost.v[0];
        memmove(&g_lost.v[0], &g_lost.v[1], sizeof(g_lost.v[0]) * (g_lost.n - 1));
        g_lost.n--;
        pthread_mutex_unlock(&g_lost.mu);
        double now = clock_mono();
        if (now > c.until)
            continue; /* its lease is over: the reaper has it */
        if (now < c.next_try) {
            keep_lost(&c); /* not yet: a claim does not pay for every name it still owes */
            continue;
        }
        int r = give_back_lost(db, c.tenant, c.owner);
        if (r == 1)
            continue;
        c.gap = c.gap < 15.0 ? c.gap * 2 : 30.0;
        c.next_try = clock_mono() + c.gap;
        keep_lost(&c);
        if (r < 0)
            return; /* the database is still out of reach: the next claim tries again */
    }
}

static int kind_due(struct db *db, void *arg, long long **ids, size_t *n)
{
    const struct claim_kind *k = arg;
    return turns_read(db, k->due, k->providers, ids, n);
}

static int kind_claim(struct db *db, long long tenant, void *arg)
{
    const struct claim_kind *k = arg;
    PGresult *r;
    int e;
    memset(k->out, 0, sizeof(*k->out));
    if (k->stamps)
        e = db_run(db, k->claim,
                   DB_ARGS(p_text("owner", k->owner), p_int("lease_seconds", k->lease_seconds),
                           p_text("providers", k->providers), p_int("tenant_id", tenant),
                           p_text("stamps", k->stamps)),
                   &r);
    else if (k->providers)
        e = db_run(db, k->claim,
                   DB_ARGS(p_text("owner", k->owner), p_int("lease_seconds", k->lease_seconds),
                           p_text("providers", k->providers), p_int("tenant_id", tenant)),
                   &r);
    else
        e = db_run(db, k->claim,
                   DB_ARGS(p_text("owner", k->owner), p_int("lease_seconds", k->lease_seconds),
                           p_int("tenant_id", tenant)),
                   &r);
    /* Lost after it may have reached the server (not a connection that could not be made). */
    if (e == STORE_EUNAVAIL && k->lost_is_unsent && !db_unreachable(db))
        lost_claim(db, tenant, k->owner, k->lease_seconds);
    return claim_from_run(e, r, k->out);
}

int store_claim(struct db *db, const char *owner, int lease_seconds, const char *providers,
                const char *stamps, struct store_claim *out)
{
    /* This claim's own name: the replica's, and a random suffix (claim_lost). Without
     * randomness two claims could share one: nothing is then given back. */
    unsigned long long nonce = 0;
    char named[CLAIM_NAME_MAX];
    int own = crypto_random(&nonce, sizeof(nonce)) == 0 &&
              (size_t)snprintf(named, sizeof(named), "%s~%016llx", owner, nonce) < sizeof(named);
    struct claim_kind k = {&claim_due, &claim, own ? named : owner, lease_seconds, providers,
                           stamps ? stamps : "{}", out, own};
    memset(out, 0, sizeof(*out));
    retry_lost(db);
    return turns_claim(&claim_turns, db, kind_due, kind_claim, &k);
}

int store_reconcile_claim(struct db *db, const char *owner, int lease_seconds,
                          const char *providers, struct store_claim *out)
{
    struct claim_kind k = {&reconcile_due, &reconcile_claim, owner, lease_seconds, providers,
                           NULL, out, 0};
    memset(out, 0, sizeof(*out));
    return turns_claim(&reconcile_turns, db, kind_due, kind_claim, &k);
}

int store_poll_claim(struct db *db, const char *owner, int lease_seconds, const char *providers,
                     struct store_claim *out)
{
    struct claim_kind k = {&poll_due, &poll_claim, owner, lease_seconds, providers, NULL, out,
                           0};
    memset(out, 0, sizeof(*out));
    return turns_claim(&poll_turns, db, kind_due, kind_claim, &k);
}

int store_poll_cancel_sent(struct db *db, const struct store_claim *c, int acknowledged)
{
    PGresult *r;
    int e = db_run(db, &poll_cancel_sent,
                   DB_ARGS(p_int("tenant_id", c->tenant_id), p_text("id", c->id),
                           p_int("lease_version", c->lease_version),
                           p_text("acknowledged", acknowledged ? "true" : "false")),
                   &r);
    if (e == STORE_OK)
        PQclear(r);
    return e;
}

int store_reconcile_send(struct db *db, struct store_claim *c, int lease_seconds,
                         const char *stamp)
{
    PGresult *r;
    int e = db_run(db, &reconcile_send,
                   DB_ARGS(p_int("tenant_id", c->tenant_id), p_text("id", c->id),
                           p_int("lease_version", c->lease_version),
                           p_int("lease_seconds", lease_seconds), p_text("stamp", stamp)),
                   &r);
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

/* A create still in flight keeps its lease (attempt.c, attempt_tick): the row's lease is moved on
 * while it is still this call's — `sending`, the same fencing token, the lease not yet over (a
 * row the reaper could take is never taken back). Nothing else changes (not updated_at: a hint's
 * next attempt is read against it). */
static const struct db_stmt lease_renew = {
    .name = "lease_renew",
    .sql = "UPDATE operations SET lease_expires_at = now() + make_interval(secs => $4) "
    "WHERE tenant_id = $1 AND id = $2 AND lease_version = $3 AND " KEYED_STATE("state")
    " = 'sending' AND lease_expires_at > now() RETURNING 1",
    .params = DB_PARAMS("tenant_id", "id", "lease_version", "lease_seconds"),
    .moves = DB_MOVES({ST_SENDING, ST_SENDING}),
};

int lease_renew_send(struct db *db, long long tenant_id, const char *id, long long lease_version,
                     int lease_seconds, int *kept)
{
    long long n = 0;
    *kept = 0;
    int e = db_run_number(db, &lease_renew,
                          DB_ARGS(p_int("tenant_id", tenant_id), p_text("id", id),
                                  p_int("lease_version", lease_version),
                                  p_int("lease_seconds", lease_seconds)),
                          DB_ROWS, &n);
    if (e == STORE_OK)
        *kept = n == 1;
    return e;
}

/* A born reservation (a row recorded `prepared` for this replica's worker, store.c's intake)
 * becomes a send: `sending` under the same fencing token, a fresh lease of $4 seconds, one more
 * transport attempt — committed before any byte leaves, as the dispatcher's claim is. Only while
 * the reservation holds (the fencing token is still ours, nobody took it), no cancel was
 * acknowledged and the provider's credential is not tripped: every born claim passes here,
 * however long it waited in the queue. */
static const struct db_stmt begin_send = {
    .name = "begin_send",
    .sql = "UPDATE operations o SET state = 'sending', "
    " lease_expires_at = now() + make_interval(secs => $4), updated_at = now(), "
    " transport_attempts = o.transport_attempts + 1, "
    " first_sent_at = coalesce(o.first_sent_at, " DB_NOW ") "
    "WHERE o.tenant_id = $1 AND o.id = $2 AND o.lease_version = $3 "
    " AND " KEYED_STATE("o.state") " = 'prepared' "
    " AND o.cancel_requested_at IS NULL "
    " AND NOT EXISTS (SELECT 1 FROM provider_breakers b WHERE b.provider = o.provider) "
    /* Instants only (updated_at is the statement's now()): the durations are begun_from's. A
     * distributed database refuses now() in RETURNING, and mishandles a sub-select there. */
    "RETURNING " DB_EPOCH("o.lease_expires_at") ", o.transport_attempts, "
    DB_EPOCH("o.first_sent_at") ", " DB_EPOCH("o.updated_at"),
    .params = DB_PARAMS("tenant_id", "id", "lease_version", "lease_seconds"),
    .moves = DB_MOVES({ST_PREPARED, ST_SENDING}),
};

/* begin_send for a batch of reservations, one statement (db_run_rows): each parameter an array
 * of the rows' values, each row written answering its ordinal first. */
static const struct db_stmt begin_send_rows = {
    .name = "begin_send_rows",
    .sql = "UPDATE operations o SET state = 'sending', "
    " lease_expires_at = now() + make_interval(secs => j.lease_seconds::integer), "
    " updated_at = now(), transport_attempts = o.transport_attempts + 1, "
    " first_sent_at = coalesce(o.first_sent_at, " DB_NOW ") "
    "FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY "
    " AS j(tenant_id, id, lease_version, lease_seconds, n) "
    "WHERE " DB_ROWS_FEW("j.n") " AND o.tenant_id = j.tenant_id::bigint AND o.id = j.id "
    " AND o.lease_version = j.lease_version::bigint "
    " AND " KEYED_STATE("o.state") " = 'prepared' "
    " AND o.cancel_requested_at IS NULL "
    " AND NOT EXISTS (SELECT 1 FROM provider_breakers b WHERE b.provider = o.provider) "
    "RETURNING j.n, " DB_EPOCH("o.lease_expires_at") ", o.transport_attempts, "
    DB_EPOCH("o.first_sent_at") ", " DB_EPOCH("o.updated_at"),
    .params = DB_PARAMS("tenant_id", "id", "lease_version", "lease_seconds"),
    .moves = DB_MOVES({ST_PREPARED, ST_SENDING}),
};

/* A reservation that is not sent (the credential was tripped meanwhile, or nothing may be sent
 * on this replica) is given back: prepared and unowned, due now for any replica's claim (which
 * skips a tripped provider until it is reset). A row cancelled or taken meanwhile is not
 * touched. */
static const struct db_stmt release_reservation = {
    .name = "release_reservation",
    .sql = "UPDATE operations SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now(), "
    " next_attempt_at = now() + make_interval(secs => $4::float8 / 1000) "
    "WHERE tenant_id = $1 AND id = $2 AND lease_version = $3 AND " KEYED_STATE("state")
    " = 'prepared' "
    "RETURNING (SELECT b.reason FROM provider_breakers b WHERE b.provider = operations.provider)",
    .params = DB_PARAMS("tenant_id", "id", "lease_version", "delay_ms"),
    .moves = DB_MOVES({ST_PREPARED, ST_PREPARED}),
};

/* Reads what begin_send returned for c (r, then cleared): 1 when the row is now `sending`. */
static int begun_from(struct store_claim *c, PGresult *r)
{
    if (PQntuples(r) == 0) {
        PQclear(r);
        return 0;
    }
    double expires = atof(PQgetvalue(r, 0, 0));
    c->transport_attempts = atoi(PQgetvalue(r, 0, 1));
    c->first_sent_db = atof(PQgetvalue(r, 0, 2));
    c->now_db = atof(PQgetvalue(r, 0, 3));
    c->lease_remaining_s = expires - c->now_db;
    c->since_first_ms = (long long)((c->now_db - c->first_sent_db) * 1000.0);
    c->born = 0; /* a claim like any other from here on */
    PQclear(r);
    return 1;
}

int lease_begin_send(struct db *db, struct store_claim *c, int lease_seconds)
{
    PGresult *r;
    int e = db_run(db, &begin_send,
                   DB_ARGS(p_int("tenant_id", c->tenant_id), p_text("id", c->id),
                           p_int("lease_version", c->lease_version),
                           p_int("lease_seconds", lease_seconds)),
                   &r);
    if (e < 0)
        return e;
    return begun_from(c, r) ? STORE_OK : STORE_ENOTFOUND;
}

int lease_begin_send_many(struct db *db, struct store_claim *const *cs, size_t n,
                          int lease_seconds, int *begun)
{
    struct param(*ps)[4] = calloc(n, sizeof(*ps));
    const struct param **rows = calloc(n, sizeof(*rows));
    PGresult **outs = calloc(n, sizeof(*outs));
    int e = STORE_ERETRY;
    if (ps && rows && outs) {
        for (size_t i = 0; i < n; i++) {
            const struct param v[4] = {p_int("tenant_id", cs[i]->tenant_id),
                                       p_text("id", cs[i]->id),
                                       p_int("lease_version", cs[i]->lease_version),
                                       p_int("lease_seconds", lease_seconds)};
            memcpy(ps[i], v, sizeof(v));
            rows[i] = ps[i];
        }
        e = db_run_rows(db, &begin_send_rows, &begin_send, n, rows, 4, outs);
    }
    for (size_t i = 0; e == STORE_OK && i < n; i++)
        begun[i] = begun_from(cs[i], outs[i]);
    free(ps);
    free(rows);
    free(outs);
    return e;
}

int lease_release_reservation(struct db *db, const struct store_claim *c, long delay_ms,
                              int *released, int *tripped)
{
    PGresult *r;
    int e = db_run(db, &release_reservation,
                   DB_ARGS(p_int("tenant_id", c->tenant_id), p_text("id", c->id),
                           p_int("lease_version", c->lease_version),
                           p_int("delay_ms", delay_ms)),
                   &r);
    if (e < 0)
        return e;
    *released = PQntuples(r) == 1;
    *tripped = *released && db_val(r, 0, 0) != NULL;
    PQclear(r);
    return STORE_OK;
}

void store_finish_init(struct store_finish *f, const struct store_claim *c, const char *kind,
                       enum op_state from)
{
    double now = clock_wall();
    *f = (struct store_finish){.tenant_id = c->tenant_id,
                               .id = c->id,
                               .provider = c->provider,
                               .lease_version = c->lease_version,
                               .lease_remaining_s = c->lease_remaining_s,
                               .from = from,
                               .kind = kind,
                               .state = from,
                               .outputs_received = -1,
                               .outputs_requested = -1,
                               .cost_micros = -1,
                               .started_at = now,
                               .finished_at = now};
}

void store_finish_evidence(struct store_finish *f, const struct up_response *res,
                           int keep_result)
{
    if (!res)
        return;
    f->http_status = res->http_status;
    f->curl_code = res->curl_code;
    f->bytes_sent = res->bytes_sent;
    if (keep_result) {
        f->resp_headers = res->headers_json;
        f->resp_body = res->body_truncated ? NULL : res->body;
        f->resp_body_len = res->body_truncated ? 0 : res->body_len;
    }
}

/* Set once the process stops (store_finish_stopping): a batch whose database is out of reach
 * gives up its other rows once one gave up. */
static atomic_int finish_stopping;

void store_finish_stopping(void)
{
    atomic_store(&finish_stopping, 1);
}

/* Runs finish until it is written or fenced: a result is never dropped for a lost connection (a
 * PostgreSQL restart), the fenced write being safe to run again on a new connection. While the
 * database fails it keeps trying for as long as the write may still be accepted
 * (bo_result_write_window_s: the lease, then a reaped row's grace); past that, a replica that
 * could reach it may have moved the operation on (the write would be fenced), and a write
 * dropped leaves the row to the reaper: unknown, never resent blindly — unless the database
 * could not be connected to at all (bo_result_write_gives_up): then it tries on, up to half an
 * hour more, for most likely nobody reaches it either. (An error the server answered that only
 * looks like a lost connection — a Citus worker out of reach, 08006 from a healthy coordinator —
 * keeps the window: it would hold this thread, and its batch, for the whole outage.) *lost says
 * a connection was lost on the way. */
static int finish_run(struct db *db, const struct store_finish *f, const struct param *ps,
                      size_t n, PGresult **r, int *lost)
{
    int e;
    long wait_ms = 50;
    double give_up = clock_mono() + bo_result_write_window_s(f->lease_remaining_s, REAP_GRACE_N);
    while ((e = db_run(db, &finish, ps, n, r)) == STORE_EUNAVAIL || e == STORE_ERETRY) {
        *lost |= e == STORE_EUNAVAIL;
        double now = clock_mono();
        if (bo_result_write_gives_up(now > give_up, now > give_up + BO_RESULT_WRITE_OUTAGE_S,
                                     db_unreachable(db), atomic_load(&finish_stopping)))
            return e;
        LOG(LOG_WARN, "result_write_retry", LS("job_id", f->id), LI("store_error", e),
            LI("wait_ms", wait_ms));
        clock_sleep_ms(wait_ms);
        wait_ms = wait_ms * 2 > 1000 ? 1000 : wait_ms * 2;
    }
    return e;
}

/* The connection may have died after the first run's commit: then the re-run met its own write
 * (and was fenced by it). The row tells: the state f wrote when it holds that write, else -1. */
static int finish_committed(struct db *db, const struct store_finish *f)
{
    PGresult *r;
    int e = db_run(db, &finish_check,
                   DB_ARGS(p_int("tenant_id", f->tenant_id), p_text("id", f->id),
                           p_int("lease_version", f->lease_version),
                           p_text("state", st_name(f->state))),
                   &r);
    if (e < 0)
        return -1;
    int st = PQntuples(r) == 1 ? st_parse(PQgetvalue(r, 0, 0)) : -1;
    PQclear(r);
    return st;
}

#define FINISH_NPARAMS 27

/* The finish statement's parameters for f, into ps[FINISH_NPARAMS]. */
static void finish_params(const struct store_finish *f, struct param *ps)
{
    const struct param v[FINISH_NPARAMS] = {
        p_int("tenant_id", f->tenant_id),
        p_text("id", f->id),
        p_int("lease_version", f->lease_version),
        p_text("state", st_name(f->state)),
        f->http_status ? p_int("http_status", f->http_status) : p_null("http_status"),
        p_text_lossy("resp_headers", f->resp_headers),
        p_bytes("resp_body", f->resp_body, f->resp_body_len),
        p_text_lossy("error", f->error),
        p_text("remote_id", f->remote_id),
        p_float("started_at", f->started_at),
        p_float("finished_at", f->finished_at),
        p_text("outcome", f->outcome),
        p_int("curl_code", f->curl_code),
        p_int("bytes_sent", f->bytes_sent),
        p_int("retry_delay_ms", f->retry_delay_ms),
        p_text("from", st_name(f->from)),
        p_text("kind", f->kind ? f->kind : "create"),
        f->outputs_received >= 0 ? p_int("outputs_received", f->outputs_received)
                                 : p_null("outputs_received"),
        f->outputs_requested >= 0 ? p_int("outputs_requested", f->outputs_requested)
                                  : p_null("outputs_requested"),
        p_text_lossy("usage", f->usage),
        p_text("poll_url", f->poll_url),
        f->poll_deadline_ms > 0 ? p_int("poll_deadline_ms", f->poll_deadline_ms)
                                : p_null("poll_deadline_ms"),
        p_text_lossy("provider_status", f->provider_status),
        p_text_lossy("outputs", f->outputs_json),
        p_bool("may_have_created", f->ambiguous),
        f->cost_micros >= 0 ? p_int("cost_micros", f->cost_micros) : p_null("cost_micros"),
        p_text_lossy("archive_plan", f->archive_plan),
    };
    memcpy(ps, v, sizeof(v));
}

static int finish_move_ok(const struct store_finish *f)
{
    if (db_stmt_moves(&finish, f->from, f->state))
        return 1;
    LOG(LOG_ERROR, "state_move_refused", LS("job_id", f->id), LS("from", st_name(f->from)),
        LS("to", st_name(f->state)));
    return 0;
}

/* What one finish answered (r, then cleared): whether it applied, and the state it wrote. When
 * fenced after a lost connection (lost), the row tells whether an earlier run had committed. The
 * state committed wakes whoever waits for it. */
/* A webhook that came before its create had committed the remote id was parked (store_webhook):
 * once the create's result is committed, the parked hint is taken and the task polled now. Done
 * here, after the commit, and not by a trigger: a trigger that writes another table is what a
 * sharded database cannot run (Citus: "cannot execute a distributed query from a query on a
 * shard"). A hint parked between the two is not applied: it only hastens a poll that comes
 * anyway, and the janitor deletes it after a day. */
static const struct db_stmt unpark = {
    .name = "unpark",
    .sql = "DELETE FROM webhook_parked WHERE provider = $1 AND remote_id = $2",
    .params = DB_PARAMS("provider", "remote_id"),
};
static const struct db_stmt unparked_poll = {
    .name = "unparked_poll",
    .sql = "UPDATE operations SET next_attempt_at = now() "
    "WHERE tenant_id = $1 AND id = $2 AND " KEYED_STATE("state") " = 'accepted'",
    .params = DB_PARAMS("tenant_id", "id"),
    .moves = DB_MOVES({ST_ACCEPTED, ST_ACCEPTED}),
};

static void unpark_hint(struct db *db, const struct store_finish *f)
{
    long long n = 0, polled = 0;
    if (db_run_number(db, &unpark,
                      DB_ARGS(p_text("provider", f->provider), p_text("remote_id", f->remote_id)),
                      DB_ROWS, &n) < 0 ||
        n == 0)
        return;
    if (db_run_number(db, &unparked_poll,
                      DB_ARGS(p_int("tenant_id", f->tenant_id), p_text("id", f->id)), DB_ROWS,
                      &polled) < 0)
        LOG(LOG_WARN, "unpark_failed", LS("job_id", f->id),
            LS("note", "the webhook's hint is dropped; the task is polled on its schedule"));
}

static void finish_applied(struct db *db, const struct store_finish *f, struct pg_result *r,
                           int lost, int *applied)
{
    /* "<decision> <state written>", or "fenced "; on PostgreSQL then the outputs inserted born
     * (archive.h) */
    const char *v = PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "fenced ";
    const char *sp = strchr(v, ' ');
    *applied = strncmp(v, "fenced ", 7) != 0;
    int written = *applied && sp && sp[1] ? st_parse(sp + 1) : -1;
    if (f->born && *applied && PQntuples(r) == 1 && PQnfields(r) > 1 && !PQgetisnull(r, 0, 1)) {
        free(f->born->inserted);
        f->born->inserted = strdup(PQgetvalue(r, 0, 1));
    }
    PQclear(r);
    if (!*applied && lost) {
        written = finish_committed(db, f);
        *applied = written >= 0;
    }
    /* Committed: whoever waits for this operation (dispatchers, clients) is told. A client
     * waiting here answers from memory when the row holds exactly what f wrote (the state asked
     * for, and the provider's answer: coalesce() keeps the stored one when f has none). */
    if (written >= 0 && written == (int)f->state && f->http_status && f->resp_headers &&
        f->resp_body)
        answers_put(f->id, f->state, f->http_status, f->resp_headers, f->resp_body,
                    f->resp_body_len);
    if (f->written)
        *f->written = written;
    if (written >= 0)
        wake_state(f->id, (enum op_state)written);
    if (written == ST_ACCEPTED && f->from != ST_ACCEPTED && f->remote_id && f->provider)
        unpark_hint(db, f);
}

/* store_finish, knowing (maybe_committed) that an earlier run of the same write may have
 * committed on a connection lost since. */
static int finish_one(struct db *db, const struct store_finish *f, int maybe_committed,
                      int *applied)
{
    *applied = 0;
    if (!finish_move_ok(f))
        return STORE_EINTERNAL;
    struct param ps[FINISH_NPARAMS];
    finish_params(f, ps);
    PGresult *r;
    int lost = maybe_committed;
    int e = finish_run(db, f, ps, FINISH_NPARAMS, &r, &lost);
    if (e < 0)
        return e;
    finish_applied(db, f, r, lost, applied);
    return STORE_OK;
}

int store_finish(struct db *db, const struct store_finish *f, int *applied)
{
    return finish_one(db, f, 0, applied);
}

void store_finish_order(const struct store_finish *const *fs, size_t n, size_t *ord)
{
    for (size_t i = 0; i < n; i++)
        ord[i] = i;
    /* Insertion sort: a batch is at most BATCH (64) results; qsort would need fs in a global
     * while several dispatcher threads sort at once. */
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0; j--) {
            const struct store_finish *x = fs[ord[j - 1]], *y = fs[ord[j]];
            if (x->tenant_id < y->tenant_id ||
                (x->tenant_id == y->tenant_id && strcmp(x->id, y->id) <= 0))
                break;
            size_t t = ord[j];
            ord[j] = ord[j - 1];
            ord[j - 1] = t;
        }
}

int store_finish_many(struct db *db, const struct store_finish *const *fs0, size_t n,
                      int *applied0, int *errors0)
{
    struct param(*ps)[FINISH_NPARAMS] = n > 1 ? calloc(n, sizeof(*ps)) : NULL;
    const struct param **rows = n > 1 ? calloc(n, sizeof(*rows)) : NULL;
    PGresult **outs = n > 1 ? calloc(n, sizeof(*outs)) : NULL;
    /* The rows in store_finish_order's order: fs[i] is fs0[ord[i]], its answers go back there
     * (out of memory: as given, one by one). */
    const struct store_finish **fs = n > 1 ? calloc(n, sizeof(*fs)) : NULL;
    size_t *ord = n > 1 ? calloc(n, sizeof(*ord)) : NULL;
    int *applied = n > 1 ? calloc(n, sizeof(*applied)) : NULL;
    int *errors = n > 1 ? calloc(n, sizeof(*errors)) : NULL;
    if (fs && ord && applied && errors) {
        store_finish_order(fs0, n, ord);
        for (size_t i = 0; i < n; i++)
            fs[i] = fs0[ord[i]];
    } else {
        free(fs);
        free(ord);
        free(applied);
        free(errors);
        fs = (const struct store_finish **)fs0;
        ord = NULL;
        applied = applied0;
        errors = errors0;
    }
    int e = STORE_ERETRY, ok = ps && rows && outs && ord;
    for (size_t i = 0; ok && i < n; i++) {
        ok = finish_move_ok(fs[i]);
        finish_params(fs[i], ps[i]);
        rows[i] = ps[i];
    }
    if (ok)
        e = db_run_rows(db, &finish_rows, &finish, n, rows, FINISH_NPARAMS, outs);
    if (e == STORE_OK) {
        for (size_t i = 0; i < n; i++) {
            errors[i] = STORE_OK;
            if (PQntuples(outs[i]) == 1) {
                finish_applied(db, fs[i], outs[i], 0, &applied[i]);
            } else { /* left alone by finish_rows (a budget, or fenced): written by finish */
                PQclear(outs[i]);
                errors[i] = finish_one(db, fs[i], 0, &applied[i]);
            }
        }
    } else {
        /* One by one: a statement failed (the batch rolled back), or the connection was lost
         * (the batch may have committed: a write fenced by itself is then recognised). A
         * stopping process whose database is still out of reach after one row's window gives
         * up the rest at once: each row's window in turn would hold the stop that many times. */
        int out_of_reach = 0;
        for (size_t i = 0; i < n; i++) {
            applied[i] = 0;
            errors[i] = out_of_reach ? STORE_EUNAVAIL
                                     : finish_one(db, fs[i], e == STORE_EUNAVAIL, &applied[i]);
            out_of_reach = errors[i] == STORE_EUNAVAIL && atomic_load(&finish_stopping);
        }
    }
    if (ord) {
        for (size_t i = 0; i < n; i++) {
            applied0[ord[i]] = applied[i];
            errors0[ord[i]] = errors[i];
        }
        free(fs);
        free(ord);
        free(applied);
        free(errors);
    }
    free(ps);
    free(rows);
    free(outs);
    return STORE_OK;
}

/* One tenant's expired leases, up to the limit; STORE_ENOTFOUND when it had none. */
struct reap_kind {
    int limit;
    int count;
};

static int reap_tenant(struct db *db, long long tenant, void *arg)
{
    struct reap_kind *k = arg;
    PGresult *r;
    int e = db_run(db, &reap, DB_ARGS(p_int("limit", k->limit - k->count), p_int("tenant_id", tenant)),
                   &r);
    if (e < 0)
        return e;
    int n = PQntuples(r);
    for (int i = 0; i < n; i++)
        LOG(LOG_WARN, "lease_expired", LS("job_id", PQgetvalue(r, i, 0)), LS("state", "unknown"));
    PQclear(r);
    k->count += n;
    /* Go on to the next tenant until the limit is reached (turns_claim stops at STORE_OK). */
    return n && k->count >= k->limit ? STORE_OK : STORE_ENOTFOUND;
}

static int reap_due_read(struct db *db, void *arg, long long **ids, size_t *n)
{
    (void)arg;
    return turns_read(db, &reap_due, NULL, ids, n);
}

int store_reap(struct db *db, int limit, int *count)
{
    struct reap_kind k = {limit, 0};
    *count = 0;
    int e = turns_claim(&reap_turns, db, reap_due_read, reap_tenant, &k);
    *count = k.count;
    return e == STORE_ENOTFOUND ? STORE_OK : e;
}

/* The id a stream named while its create is still in flight, kept on the row at once (fenced:
 * our lease, still `sending` — an earlier attempt's id, if any, is this attempt's no more): if
 * this replica dies before the result is written, the operation becomes unknown with it, and
 * the reconciler reads the generation back by it. */
static const struct db_stmt note_remote = {
    .name = "note_remote",
    .sql = "UPDATE operations SET remote_id = $4 "
           "WHERE tenant_id = $1 AND id = $2 AND lease_version = $3 AND " KEYED_STATE("state")
           " = 'sending'",
    .params = DB_PARAMS("tenant_id", "id", "lease_version", "remote_id"),
    .moves = DB_MOVES({ST_SENDING, ST_SENDING}),
};

int store_note_remote(struct db *db, long long tenant_id, const char *id, long long lease_version,
                      const char *remote_id)
{
    long long n = 0;
    return db_run_number(db, &note_remote,
                         DB_ARGS(p_int("tenant_id", tenant_id), p_text("id", id),
                                 p_int("lease_version", lease_version),
                                 p_text("remote_id", remote_id)),
                         DB_ROWS, &n);
}

/* A verified webhook's hint put back after the reconciler's read of its task failed for a
 * reason that says nothing of the task (no answer, a 5xx, a 404 before it is visible): a
 * verdict's write (kind reconcile) clears the hint, and the provider never delivers that event
 * again (deduped). The verdict `hint_unread` keeps it in its own write (FINISH_SET, and the
 * distributed function since migration 0034: no crash between two statements can lose it);
 * this is for a database still on the older function during a rolling upgrade. Fenced by the
 * reconciler's token; only on a row still unknown and unhinted (otherwise a no-op). */
static const struct db_stmt keep_hint = {
    .name = "keep_hint",
    .sql = "UPDATE operations SET webhook_hint = $4 "
           "WHERE tenant_id = $1 AND id = $2 AND lease_version = $3 AND " KEYED_STATE("state")
           " IN ('unknown', 'review') AND webhook_hint IS NULL",
    .params = DB_PARAMS("tenant_id", "id", "lease_version", "hint"),
    .moves = DB_MOVES({ST_UNKNOWN, ST_UNKNOWN}, {ST_REVIEW, ST_REVIEW}),
};

int store_keep_hint(struct db *db, const struct store_claim *c, const char *hint)
{
    long long n = 0;
    return db_run_number(db, &keep_hint,
                         DB_ARGS(p_int("tenant_id", c->tenant_id), p_text("id", c->id),
                                 p_int("lease_version", c->lease_version),
                                 p_text("hint", hint)),
                         DB_ROWS, &n);
}

/* The record of a stream so far, kept on its row in batches while the call goes on (fenced like
 * note_remote): the first batch of an attempt ($5 = 0) replaces what an earlier attempt left and
 * clears its status and headers (no answer is complete yet); each next one is appended only where
 * the row holds exactly the bytes before it ($5), so a lost batch stops the rest rather than
 * leave a gap. */
static const struct db_stmt note_partial = {
    .name = "note_partial",
    .sql = "UPDATE operations SET "
           " resp_body = CASE WHEN $5::bigint = 0 THEN $4::bytea ELSE resp_body || $4::bytea END, "
           " resp_status = CASE WHEN $5::bigint = 0 THEN NULL ELSE resp_status END, "
           " resp_headers = CASE WHEN $5::bigint = 0 THEN NULL ELSE resp_headers END "
           "WHERE tenant_id = $1 AND id = $2 AND lease_version = $3 AND " KEYED_STATE("state")
           " = 'sending' AND ($5::bigint = 0 OR length(resp_body) = $5::bigint)",
    .params = DB_PARAMS("tenant_id", "id", "lease_version", "bytes", "offset"),
    .moves = DB_MOVES({ST_SENDING, ST_SENDING}),
};

int store_note_partial(struct db *db, long long tenant_id, const char *id,
                       long long lease_version, const char *bytes, size_t len, long long offset,
                       int *kept)
{
    long long n = 0;
    int e = db_run_number(db, &note_partial,
                          DB_ARGS(p_int("tenant_id", tenant_id), p_text("id", id),
                                  p_int("lease_version", lease_version),
                                  p_bytes("bytes", bytes, len), p_int("offset", offset)),
                          DB_ROWS, &n);
    *kept = e == STORE_OK && n == 1;
    return e;
}

/* What a cut stream left on its row (the record of the events that arrived), read under the
 * reconciler's lease to resume the stream after its last whole event (resume.h). Reads only. */
static const struct db_stmt partial_record = {
    .rerun_safe = 1,
    .name = "partial_record",
    .sql = "SELECT resp_body FROM operations "
           "WHERE tenant_id = $1 AND id = $2 AND lease_version = $3 AND resp_body IS NOT NULL",
    .params = DB_PARAMS("tenant_id", "id", "lease_version"),
};

int store_partial_record(struct db *db, const struct store_claim *c, char **body, size_t *len)
{
    PGresult *r;
    *body = NULL;
    *len = 0;
    int e = db_run(db, &partial_record,
                   DB_ARGS(p_int("tenant_id", c->tenant_id), p_text("id", c->id),
                           p_int("lease_version", c->lease_version)),
                   &r);
    if (e < 0)
        return e;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return STORE_ENOTFOUND;
    }
    unsigned char *b = NULL;
    e = db_bytea_decode(db_val(r, 0, 0), &b, len) < 0 ? STORE_ERETRY : STORE_OK;
    *body = (char *)b;
    PQclear(r);
    return e;
}

static const struct db_stmt *const statements[] = {
    &claim, &claim_lost, &reconcile_claim, &poll_claim, &poll_cancel_sent, &reconcile_send,
    &lease_renew,
    &finish,
    &finish_check, &reap,
    &claim_due, &reconcile_due, &poll_due, &reap_due, &unpark, &unparked_poll,
    &begin_send, &begin_send_rows, &finish_rows, &release_reservation, &note_remote,
    &note_partial, &partial_record, &keep_hint,
};

const struct db_stmt *const *lease_statements(size_t *n)
{
    *n = sizeof(statements) / sizeof(statements[0]);
    return statements;
}
