#include "idemgate/archive.h"

#include "idemgate/archplan.h"
#include "idemgate/blobstore.h"
#include "idemgate/clock.h"
#include "idemgate/connguard.h"
#include "idemgate/crash.h"
#include "idemgate/engine.h"
#include "idemgate/fetchpol.h"
#include "idemgate/lease.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/provider.h"
#include "idemgate/resultq.h"
#include "idemgate/secrets.h"
#include "idemgate/turns.h"
#include "idemgate/upstream.h"
#include "idemgate/wpool.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <libpq-fe.h>
#include <openssl/evp.h>
#include <stdatomic.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define IDLE_MS 250
#define PLAN_BATCH 8
/* The most outputs one claim takes (fewer when the engine or archive_max_inflight has less room). */
#define CLAIM_BATCH 8
#define NOT_HERE_DELAY_MS 60000
#define MAX_REDIRECTS 3
/* Results one thread reads before it looks at anything else. */
#define RESULTS_PER_TURN 64
/* The most bytes of the providers' text[] literal. */
#define PROVIDERS_MAX 8192

/* One archive pool per process: what its claim function needs beyond the wpool's arguments. */
static const struct cfg *g_cfg;

/* What an archive claim's lease holds beyond its longest fetch: the write of its end. A publish
 * (an fsync, an S3 PUT) that outlasts it costs a second copy by whoever claims the row next,
 * never the output (objects are named by their content; a fenced end is not written). */
#define PUBLISH_MARGIN_S 5

/* Each fetch is cut at what its claim's lease has left, and nothing renews an archive lease:
 * with the defaults (lease 180 s, a fetch's 300 s) every copy was cut at ~179 s — a large output
 * tried again from its first byte until its URL expired. */
int archive_lease_s(const struct cfg *cfg)
{
    long longest = 0;
    for (size_t i = 0; i < cfg->n_providers; i++)
        if (cfg->providers[i].archive && cfg->providers[i].archive->timeout_ms > longest)
            longest = cfg->providers[i].archive->timeout_ms;
    long need = (longest + 999) / 1000 + PUBLISH_MARGIN_S;
    return need > cfg->lease_seconds ? (int)need : cfg->lease_seconds;
}

static char *g_providers; /* the configured provider names as a text[] literal */
static struct blob_store *g_blob;

/* Completed operations of this replica's providers whose outputs are not planned yet. */
static const struct db_stmt plan_pick = {
    .name = "archive_plan_pick",
    .sql =
        "SELECT tenant_id, id, provider, resp_body, remote_id, req_credential, "
        " extract(epoch FROM coalesce(finished_at, updated_at))::float8 FROM operations "
        "WHERE state = 'completed' AND archive_planned_at IS NULL AND provider = ANY($1::text[]) "
        "ORDER BY finished_at LIMIT 8",
    .params = DB_PARAMS("providers"),
};

/* Marks one operation planned and inserts its outputs ($3: [{n, kind, url, credential,
 * expires}]) in one statement: of two workers planning it, only the one whose UPDATE matched
 * inserts anything. */
static const struct db_stmt plan_write = {
    .name = "archive_plan_write",
    .sql =
        "WITH m AS (UPDATE operations SET archive_planned_at = now() "
        "  WHERE tenant_id = $1 AND id = $2 AND " KEYED_STATE("state") " = 'completed' "
        "  AND archive_planned_at IS NULL "
        "  RETURNING tenant_id, id, provider) "
        "INSERT INTO archive_outputs (tenant_id, op_id, n, provider, kind, source_url, credential, "
        " expires_at, state, last_error) "
        "SELECT m.tenant_id, m.id, x.n, m.provider, x.kind, x.url, x.credential, "
        " CASE WHEN x.expires > 0 THEN to_timestamp(x.expires) END, coalesce(x.state, 'pending'), "
        " x.error "
        "FROM m CROSS JOIN jsonb_to_recordset($3::jsonb) "
        " AS x(n integer, kind text, url text, credential text, expires float8, state text, "
        "  error text) "
        "ON CONFLICT DO NOTHING",
    .params = DB_PARAMS("tenant_id", "id", "plan"),
};

/* The archive claim: up to $5 of one tenant's ($4) most overdue pending outputs of this
 * replica's providers, each under a new lease and fencing token; the attempt is counted by the
 * claim itself (migration 0026: a function, so that each row is updated by its key whatever
 * the table's size when the plan was made). The tenants are served in turn (turns.h), a batch a
 * turn: one ring read and one claim for up to CLAIM_BATCH outputs, where one output a claim cost
 * a ring read and a claim each. */
#define ARCHIVE_DUE(providers)                                                                     \
    "state = 'pending' AND next_attempt_at <= now() "                                             \
    "AND (lease_expires_at IS NULL OR lease_expires_at < now()) "                                  \
    "AND provider = ANY(" providers "::text[]) "
static const struct db_stmt claim = {
    .name = "archive_claim",
    .sql = "SELECT * FROM idemgate_archive_claim($4, $1, $2, $3::text[], $5)",
    .params = DB_PARAMS("owner", "lease_seconds", "providers", "tenant_id", "limit"),
};
/* The tenants with due copies. */
static const struct db_stmt claim_due = {
    .rerun_safe = 1,
    .name = "archive_claim_due",
    .sql = TURNS_DUE("archive_outputs", ARCHIVE_DUE("$1")),
    .sql_distributed = TURNS_DUE_DISTRIBUTED("archive_outputs", ARCHIVE_DUE("$1")),
    .params = DB_PARAMS("providers"),
};
enum {
    AC_TENANT,
    AC_OP,
    AC_N,
    AC_LEASE_VERSION,
    AC_PROVIDER,
    AC_KIND,
    AC_URL,
    AC_CREDENTIAL,
    AC_EXPIRES,
    AC_NOW,
    AC_ATTEMPTS,
    AC_BODY,
    AC_REMOTE
};

/* A copy's conclusion, written only under the claim that made it (fencing) — but a stored copy
 * (archived, with its object's hash) is final whatever became of that claim: the row still
 * pending under another claim, or ended expired or failed by a later claim without an object,
 * takes it. Its publish (an fsync, an upload) may end after the lease; another claim's copy of
 * the same URL fails once it has expired, and the copy stored was then dropped — a paid output
 * lost with its bytes in the store (review, 2026-12-06). */
static const struct db_stmt finish = {
    .name = "archive_finish",
    .sql =
        /* The clock is read once, by c (no now() inside CASE: see lease.c, CLAIM_LEASE). */
        "WITH c AS MATERIALIZED (SELECT now() AS at FROM archive_outputs "
        " WHERE tenant_id = $1 AND op_id = $2 AND n = $3) "
        "UPDATE archive_outputs SET state = $5, "
        /* An expiry keeps the error that kept the copy from succeeding; a success keeps it too. */
        " last_error = CASE WHEN $6::text IS NULL THEN last_error "
        "  WHEN $5 = 'expired' AND last_error IS NOT NULL THEN $6::text || '; last error: ' || "
        "last_error "
        "  ELSE $6 END, "
        " next_attempt_at = now() + make_interval(secs => $7::float8 / 1000), "
        " sha256 = coalesce($8, sha256), bytes = coalesce($9::bigint, bytes), "
        " content_type = coalesce($10, content_type), backend = coalesce($11, backend), "
        " stored_by = coalesce($12, stored_by), "
        " archived_at = CASE WHEN $5 = 'archived' THEN c.at END, "
        " lease_owner = NULL, lease_expires_at = NULL, "
        /* A claim given back before any GET (untried): its attempt is not counted — once: a
         * write sent again after a lost connection finds the row unowned already. */
        " attempts = CASE WHEN $13::boolean AND lease_owner IS NOT NULL "
        "  THEN greatest(attempts - 1, 0) ELSE attempts END "
        "FROM c WHERE tenant_id = $1 AND op_id = $2 AND n = $3 "
        " AND ((lease_version = $4 AND " KEYED_STATE("state") " = 'pending') "
        "  OR ($5 = 'archived' AND $8::text IS NOT NULL AND (" KEYED_STATE("state") " = 'pending' "
        "   OR (" KEYED_STATE("state") " IN ('expired', 'failed') AND sha256 IS NULL)))) "
        "RETURNING state",
    .params = DB_PARAMS("tenant_id", "op_id", "n", "lease_version", "state", "error", "delay_ms",
                        "sha256", "bytes", "content_type", "backend", "stored_by", "untried"),
};

/* finish for a batch of ends, one statement (db_run_rows): the same SET list over the rows'
 * arrays, each row written answering its ordinal first. */
static const struct db_stmt finish_rows = {
    .name = "archive_finish_rows",
    .sql =
        "WITH c AS MATERIALIZED (SELECT now() AS at) "
        "UPDATE archive_outputs a SET state = j.state, "
        " last_error = CASE WHEN j.error IS NULL THEN a.last_error "
        "  WHEN j.state = 'expired' AND a.last_error IS NOT NULL THEN j.error || '; last error: ' || "
        "a.last_error "
        "  ELSE j.error END, "
        " next_attempt_at = now() + make_interval(secs => j.delay_ms::float8 / 1000), "
        " sha256 = coalesce(j.sha256, a.sha256), bytes = coalesce(j.bytes::bigint, a.bytes), "
        " content_type = coalesce(j.content_type, a.content_type), "
        " backend = coalesce(j.backend, a.backend), stored_by = coalesce(j.stored_by, a.stored_by), "
        " archived_at = CASE WHEN j.state = 'archived' THEN c.at END, "
        " lease_owner = NULL, lease_expires_at = NULL, "
        " attempts = CASE WHEN j.untried::boolean AND a.lease_owner IS NOT NULL "
        "  THEN greatest(a.attempts - 1, 0) "
        "  ELSE a.attempts END "
        "FROM c, unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], "
        "  $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], "
        "  $13::text[]) "
        " WITH ORDINALITY AS j(tenant_id, op_id, n, lease_version, state, error, delay_ms, sha256, "
        "  bytes, content_type, backend, stored_by, untried, ord) "
        "WHERE " DB_ROWS_FEW("j.ord") " AND a.tenant_id = j.tenant_id::bigint AND a.op_id = j.op_id "
        " AND a.n = j.n::integer "
        " AND ((a.lease_version = j.lease_version::bigint "
        "   AND " KEYED_STATE("a.state") " = 'pending') "
        "  OR (j.state = 'archived' AND j.sha256 IS NOT NULL AND (" KEYED_STATE("a.state")
        " = 'pending' OR (" KEYED_STATE("a.state") " IN ('expired', 'failed') "
        "   AND a.sha256 IS NULL)))) "
        "RETURNING j.ord, a.state",
    .params = DB_PARAMS("tenant_id", "op_id", "n", "lease_version", "state", "error", "delay_ms",
                        "sha256", "bytes", "content_type", "backend", "stored_by", "untried"),
};

/* Whether a copy's end is in the database as this claim wrote it: asked only when a write that
 * lost its connection may have committed (fin_flush), and its fenced rewrite found the row no
 * longer pending. A terminal end is exact: only this claim's write can have ended the row under
 * its version, and no claim takes a row that is not pending — but a stored copy, final whatever
 * claim held the row, is the row's archived end whatever its version. */
static const struct db_stmt end_written = {
    .name = "archive_end_written",
    .sql = "SELECT 1 FROM archive_outputs WHERE tenant_id = $1 AND op_id = $2 AND n = $3 "
           " AND (lease_version = $4 OR $5 = 'archived') AND state = $5 AND lease_owner IS NULL",
    .params = DB_PARAMS("tenant_id", "op_id", "n", "lease_version", "state"),
};

static const struct db_stmt job_outputs = {
    .name = "archive_job_outputs",
    .sql = "SELECT coalesce((SELECT json_agg(json_build_object('index', a.n, 'state', a.state, "
           "   'kind', a.kind, 'attempts', a.attempts, 'last_error', a.last_error, "
           "   'sha256', a.sha256, 'bytes', a.bytes, 'content_type', a.content_type, "
           "   'source_expires_at', to_char(a.expires_at AT TIME ZONE 'UTC', "
           "     'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), "
           "   'archived_at', to_char(a.archived_at AT TIME ZONE 'UTC', "
           "     'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), "
           "   'href', CASE WHEN a.state = 'archived' THEN "
           "     '/v1/jobs/' || a.op_id || '/outputs/' || a.n END) ORDER BY a.n) "
           "  FROM archive_outputs a WHERE a.tenant_id = $1 AND a.op_id = o.id), "
           "'[]')::text, "
           " o.archive_planned_at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM archive_outputs a "
           "  WHERE a.tenant_id = $1 AND a.op_id = o.id AND " KEYED_STATE("a.state")
           " = 'pending') "
           "FROM operations o WHERE o.tenant_id = $1 AND o.id = $2",
    .params = DB_PARAMS("tenant_id", "id"),
};

static const struct db_stmt output_get = {
    .name = "archive_output_get",
    .sql =
        "SELECT o.id, o.archive_planned_at IS NOT NULL, a.n, a.state, a.sha256, a.bytes, "
        " a.content_type, a.last_error, a.backend, a.stored_by "
        "FROM operations o "
        "LEFT JOIN archive_outputs a ON a.tenant_id = o.tenant_id AND a.op_id = o.id AND a.n = $3 "
        "WHERE o.tenant_id = $1 AND o.id = $2",
    .params = DB_PARAMS("tenant_id", "id", "n"),
};

/* ---- planning ------------------------------------------------------------------------- */

static int born_take(int want);

/* Whether the profile's archive policy refuses output o for what its URL says (its scheme,
 * credentials in it, its host not declared, a content endpoint off the provider's origin): a fact
 * of the URL and the configuration, known before anything is fetched. Such an output is planned
 * already ended, failed with the reason in why: never claimed, never handed to a thread — where
 * each cost a claim, a wake-up and a write of its end for a verdict the plan could give (every
 * output of a profile without `archive.hosts`, and of `make bench`'s end-to-end run). The address
 * the host resolves to (private, loopback…) is judged at the copy. The replica that writes the
 * result decides with its own `archive` member: every replica is given the same. */
static int plan_refused(const struct cfg_provider *p, const struct ap_output *o, char *why,
                        size_t cap)
{
    if (!p->archive || (o->kind != AP_URL && o->kind != AP_ENDPOINT))
        return 0;
    struct fp_policy pol = archprof_policy(p->archive);
    return fp_url_allowed(&pol, o->url, o->kind == AP_ENDPOINT ? p->base_url : NULL, why, cap) <
           0;
}

/* The plan as the finish statement reads it (jsonb_to_recordset): with born, the first fetched
 * outputs the archive has room for carry this replica as their lease owner and the lease's
 * length (lease.c's FINISH_PLAIN_SQL inserts them claimed); born->taken says how many. An output
 * the policy refuses carries its end instead ("state": "failed", "error"). */
static char *plan_json(const struct cfg_provider *p, const char *credential,
                       const struct ap_plan *pl, struct archive_born *born)
{
    int fetched = 0;
    char why[512];
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < pl->n; i++) {
        const struct ap_output *o = &pl->out[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "n", (double)i);
        cJSON_AddStringToObject(x, "kind", ap_kind_name(o->kind));
        if (o->url)
            cJSON_AddStringToObject(x, "url", o->url);
        /* Only a content endpoint, on the provider's own origin, is read with its credential. */
        if (o->kind == AP_ENDPOINT && credential && *credential && p->auth_header)
            cJSON_AddStringToObject(x, "credential", credential);
        cJSON_AddNumberToObject(x, "expires", o->kind == AP_B64 ? 0 : o->expires_at);
        if (plan_refused(p, o, why, sizeof(why))) {
            cJSON_AddStringToObject(x, "state", "failed");
            cJSON_AddStringToObject(x, "error", why);
        } else {
            fetched += o->kind == AP_URL || o->kind == AP_ENDPOINT;
        }
        cJSON_AddItemToArray(arr, x);
    }
    if (arr && cJSON_GetArraySize(arr) != (int)pl->n) { /* out of memory */
        cJSON_Delete(arr);
        return NULL;
    }
    if (arr && born && fetched) {
        born->mono = clock_mono(); /* before the write: the leases it begins are no older */
        born->taken = born_take(fetched);
        size_t i = 0;
        int marked = 0;
        cJSON *x = NULL;
        cJSON_ArrayForEach(x, arr)
        {
            enum ap_kind k = pl->out[i++].kind;
            if (marked < born->taken && (k == AP_URL || k == AP_ENDPOINT) &&
                !cJSON_GetObjectItemCaseSensitive(x, "state")) {
                cJSON_AddStringToObject(x, "owner", g_cfg->instance_id);
                cJSON_AddNumberToObject(x, "lease", (double)archive_lease_s(g_cfg));
                marked++;
            }
        }
    }
    char *s = arr ? cJSON_PrintUnformatted(arr) : NULL;
    cJSON_Delete(arr);
    return s;
}

void archive_plan_written(const char *plan, const char *job_id, const char *provider)
{
    /* (A plan ended nothing unless a member says so: no parse of every result's plan.) */
    cJSON *arr = plan && strstr(plan, "\"state\"") ? cJSON_Parse(plan) : NULL;
    const cJSON *x = NULL;
    cJSON_ArrayForEach(x, arr)
    {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(x, "state");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(x, "n");
        const cJSON *err = cJSON_GetObjectItemCaseSensitive(x, "error");
        if (!cJSON_IsString(st) || !cJSON_IsNumber(n))
            continue;
        /* Counted and said as a claim's refusal was, never dropped in silence. */
        LOG(LOG_WARN, "archive_refused", LS("job_id", job_id), LS("provider", provider),
            LI("output", n->valueint), LS("error", cJSON_IsString(err) ? err->valuestring : ""));
        metrics_archive(1);
    }
    cJSON_Delete(arr);
}

char *archive_plan_json(const struct cfg_provider *p, const struct store_finish *f,
                        const char *remote_id, const char *credential, struct archive_born *born)
{
    if (!p || f->state != ST_COMPLETED || !f->resp_body)
        return NULL;
    struct ap_plan pl;
    char *js = NULL;
    if (ap_plan_outputs(p, f->resp_body, f->resp_body_len, NULL,
                        f->remote_id ? f->remote_id : remote_id, f->finished_at, &pl) == 0)
        js = plan_json(p, credential, &pl, p->archive ? born : NULL);
    ap_plan_fini(&pl);
    if (!js && born) /* out of memory: nothing is inserted born */
        archive_born_settle(born, 0, 0, NULL, NULL, NULL, NULL);
    return js;
}

/* Plans up to PLAN_BATCH completed operations; how many were read (-1: the read failed). */
static int plan_some(struct db *db)
{
    PGresult *r;
    if (db_run(db, &plan_pick, DB_ARGS(p_text("providers", g_providers)), &r) < 0)
        return -1;
    int n = PQntuples(r);
    for (int i = 0; i < PQntuples(r); i++) {
        const char *prov = db_val(r, i, 2);
        const struct cfg_provider *p = cfg_find_provider(g_cfg, prov, strlen(prov));
        if (!p)
            continue;
        unsigned char *body = NULL;
        size_t len = 0;
        (void)db_bytea_decode(db_val(r, i, 3), &body, &len);
        struct ap_plan pl;
        if (ap_plan_outputs(p, (const char *)body, len, NULL, db_val(r, i, 4),
                            atof(db_val(r, i, 6)), &pl) == 0) {
            char *js = plan_json(p, db_val(r, i, 5), &pl, NULL);
            PGresult *w;
            if (js && db_run(db, &plan_write,
                             DB_ARGS(p_text("tenant_id", db_val(r, i, 0)),
                                     p_text("id", db_val(r, i, 1)), p_text("plan", js)),
                             &w) == STORE_OK) {
                if (atoi(PQcmdTuples(w)) > 0 || pl.n == 0)
                    LOG(LOG_INFO, "archive_planned", LS("job_id", db_val(r, i, 1)),
                        LS("provider", prov), LI("outputs", (long long)pl.n));
                if (atoi(PQcmdTuples(w)) > 0)
                    archive_plan_written(js, db_val(r, i, 1), prov);
                PQclear(w);
            }
            free(js);
        }
        ap_plan_fini(&pl);
        free(body);
    }
    PQclear(r);
    return n;
}

/* Results are written with their plan (archive_plan_json: a dispatched create's, a poll's, a
 * reconcile's found result): the planner is the fallback for the rest (an older replica's
 * writes, a plan that could not be made). It reads what is left
 * unplanned at most every PLAN_EVERY_MS, and again at the next claim while it finds some — not
 * before every claim, one round trip per copy that found nothing. */
#define PLAN_EVERY_MS 1000
static _Atomic long long plan_next_ms; /* clock_mono, in ms, of the planner's next read */

static void plan_due(struct db *db)
{
    long long now = (long long)(clock_mono() * 1000);
    if (now < atomic_load(&plan_next_ms))
        return;
    int n = plan_some(db);
    atomic_store(&plan_next_ms, n > 0 ? now : now + PLAN_EVERY_MS);
}

static struct turns claim_turns = TURNS_INIT;

struct claim_args {
    const char *owner;
    int lease_seconds;
    struct store_claim *out;
    struct archiver *A;
    int room; /* held for the claim (claim_tenant), given back or turned into its rows' */
    int full; /* no room: the claim was not made */
};

static int hold_room(struct archiver *A);

static int claim_due_read(struct db *db, void *arg, long long **ids, size_t *n)
{
    (void)arg;
    return turns_read(db, &claim_due, g_providers, ids, n);
}

/* The room is held only once a tenant with due outputs was found, for the claim statement
 * itself: an idle thread's look for due work holds none, so a result's write finds the room
 * for its born claims (archive.h) while the archive threads poll. */
static int claim_tenant(struct db *db, long long tenant, void *arg)
{
    struct claim_args *a = arg;
    struct store_claim *out = a->out;
    PGresult *r;
    if (!a->room && !(a->room = hold_room(a->A))) {
        a->full = 1;
        return TURN_KEPT; /* no room on this replica: the tenant is served first next time */
    }
    int e = db_run(db, &claim,
                   DB_ARGS(p_text("owner", a->owner), p_int("lease_seconds", a->lease_seconds),
                           p_text("providers", g_providers), p_int("tenant_id", tenant),
                           p_int("limit", a->room)),
                   &r);
    if (e < 0)
        return e;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return STORE_ENOTFOUND;
    }
    /* The rows stay in res: archive_one takes them one by one (AC_ columns). */
    out->res = r;
    out->tenant_id = atoll(PQgetvalue(r, 0, AC_TENANT));
    out->id = db_val(r, 0, AC_OP);
    out->lease_version = atoll(PQgetvalue(r, 0, AC_LEASE_VERSION));
    out->provider = db_val(r, 0, AC_PROVIDER);
    return STORE_OK;
}


/* ---- copying -------------------------------------------------------------------------- */

struct copy {
    const struct cfg_provider *p;
    struct blob_tmp tmp;
    long long cap;
    int too_big;
    int refused_addr;
    char refused_ip[64];
    enum fp_addr_class refused_class;
    unsigned char head[16];
    size_t head_len;
    char why[512];
    int permanent;
    char content_type[128];
    CURL *easy; /* the transfer in flight */
    const atomic_int *stopping; /* the archiver's quiesced flag: a copy in flight lets go */
    int stopped;                /* it did: the row is given back, not failed */
};

/* A copy's tick (eng_submit_easy_ticked, every ENG_TICK_MS): a replica that stops lets go of
 * its copies in flight (their rows given back, due now for another replica) instead of holding
 * its shutdown for up to a whole archive.timeout_ms — longer than any grace period a deployment
 * gives it. */
static int copy_tick(void *arg)
{
    struct copy *x = arg;
    if (x->stopping && atomic_load(x->stopping)) {
        x->stopped = 1;
        return 1;
    }
    return 0;
}

static int put(struct copy *x, const void *ptr, size_t len)
{
    if (x->tmp.bytes + (long long)len > x->cap) {
        x->too_big = 1;
        return -1;
    }
    if (x->head_len < sizeof(x->head)) {
        size_t k = sizeof(x->head) - x->head_len < len ? sizeof(x->head) - x->head_len : len;
        memcpy(x->head + x->head_len, ptr, k);
        x->head_len += k;
    }
    if (blob_tmp_write(&x->tmp, ptr, len) < 0)
        return -1;
    /* Test builds: a crash with part of the bytes written, the rest not. */
    CRASH_POINT("archive_mid_copy");
    return 0;
}

static size_t on_body(char *ptr, size_t size, size_t n, void *arg)
{
    return put(arg, ptr, size * n) == 0 ? size * n : 0;
}

/* Records that ip is refused for x (its class names it in the copy's error); 1 when it is. */
static int addr_refused(struct copy *x, const char *ip)
{
    if (fp_addr_allowed(ip, x->p->archive->allow_private))
        return 0;
    x->refused_addr = 1;
    x->refused_class = fp_addr_class(ip);
    snprintf(x->refused_ip, sizeof(x->refused_ip), "%s", ip);
    return 1;
}

/* Every address libcurl is about to connect to is checked, so a host name that resolves (or
 * re-resolves) to a private address is refused like a literal one. */
static curl_socket_t open_checked(void *arg, curlsocktype purpose, struct curl_sockaddr *a)
{
    struct copy *x = arg;
    char ip[64] = "";
    (void)purpose;
    if (a->family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)&a->addr)->sin_addr, ip, sizeof(ip));
    else if (a->family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)(void *)&a->addr)->sin6_addr, ip, sizeof(ip));
    if (addr_refused(x, ip))
        return CURL_SOCKET_BAD;
    return socket(a->family, a->socktype, a->protocol);
}

/* The copy's request is about to leave on a connection libcurl may have reused: one a
 * provider's call kept alive (upstream.h) never passed open_checked, so the address it goes to
 * is checked again here, at every sending; and one with bytes waiting would hand them over as
 * the copy's bytes (connguard.h): the engine starts the copy again on a new connection. */
static int send_checked(void *arg, char *primary_ip, char *local_ip, int primary_port,
                        int local_port)
{
    struct copy *x = arg;
    (void)local_ip;
    if (addr_refused(x, primary_ip ? primary_ip : ""))
        return CURL_PREREQFUNC_ABORT;
    return cg_stale(x->easy, primary_ip, primary_port, local_port) ? CURL_PREREQFUNC_ABORT
                                                                   : CURL_PREREQFUNC_OK;
}

/* Sniffs a type for bytes that came without one (base64 in a result). */
static const char *sniff(const unsigned char *h, size_t n)
{
    if (n >= 8 && memcmp(h, "\x89PNG\r\n\x1a\n", 8) == 0)
        return "image/png";
    if (n >= 3 && memcmp(h, "\xff\xd8\xff", 3) == 0)
        return "image/jpeg";
    if (n >= 12 && memcmp(h, "RIFF", 4) == 0 && memcmp(h + 8, "WEBP", 4) == 0)
        return "image/webp";
    if (n >= 8 && memcmp(h + 4, "ftyp", 4) == 0)
        return "video/mp4";
    return "application/octet-stream";
}

/* One archive copy on the call engine: its claim, the copy, and the transfer in flight. The
 * transfer's bytes go to the temporary file from the engine thread (on_body); everything else —
 * the status, a redirect, publishing the file, the write — is done by an archive thread. */
struct archiver;
struct arch_job {
    struct rq_item node;
    struct archiver *A;
    struct store_claim c; /* owned; its res holds the claimed row (AC_) */
    const struct cfg_provider *p;
    struct copy x;
    int n, attempts, kind;
    double expires, now; /* now: the database's clock at the claim (Unix seconds) */
    double claimed;      /* clock_mono() then: now + (clock_mono() - claimed) is the time later */
    double lease_end; /* clock_mono() seconds at which the claim's lease runs out */
    long timeout_ms;
    char *cur; /* the URL being read */
    int hop;
    CURL *h; /* the transfer in flight, its header lines and its credential line */
    struct curl_slist *hdrs;
    char *auth;
    int curl_code;
};

struct archiver {
    const struct cfg *cfg;
    struct wpool *pool;
    struct eng *eng;
    struct rq *results;
    atomic_int starved;  /* the last claim found the engine full, or archive_max_inflight */
    atomic_int copying;  /* copies claimed and not yet written */
    atomic_int claiming; /* room held by claims being made (engine slots not yet taken) */
    atomic_int to_start; /* rows claimed (or born: archive_born_settle), their slots taken, not
                          * yet started */
    atomic_int quiesced; /* no room is taken for born claims any more; those handed over are
                          * given back */
};

/* The archiver results written here hand their born claims to (NULL: none runs). Set once its
 * threads run, cleared before it is freed: every writer of results (the dispatcher, the
 * reconciler) has stopped by then (main.c's stop_all). */
static _Atomic(struct archiver *) g_arch;

/* What a copy leaves of its claim's lease: the end is written within it. */
#define COPY_MARGIN_S 1.0

static void arch_room(void *arg);

/* The rows this thread's claim took (claim_with_room), given back once they are started. */
static _Thread_local int claimed_rows;

/* Frees the credential line and the header lines of j's transfer, each zeroed first: libcurl's
 * list holds its own copy of the credential line. */
static void headers_free(struct arch_job *j)
{
    for (struct curl_slist *e = j->hdrs; e; e = e->next)
        explicit_bzero(e->data, strlen(e->data));
    curl_slist_free_all(j->hdrs);
    j->hdrs = NULL;
    if (j->auth) {
        explicit_bzero(j->auth, strlen(j->auth));
        free(j->auth);
        j->auth = NULL;
    }
}

/* Builds the GET of url into j->x (its temporary file already open) as j->h. 0, or -1 (x.why). */
static int get_prepare(struct arch_job *j, const char *url, int endpoint, const char *credential)
{
    struct copy *x = &j->x;
    x->refused_addr = 0; /* each hop's own (a redirect's GET is prepared again) */
    CURL *h = curl_easy_init();
    if (!h) {
        snprintf(x->why, sizeof(x->why), "out of memory");
        return -1;
    }
    struct fp_policy pol = archprof_policy(x->p->archive);
    curl_easy_setopt(h, CURLOPT_URL, url);
    /* A content endpoint is on the provider's own origin, whose scheme the profile chose. */
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, pol.allow_http || endpoint ? "http,https" : "https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROXY, "");
    /* On the provider's own origin (a content endpoint, or an output URL there), its CA file in
     * place of the system's certificates; a CDN's URL keeps the system's. */
    if (x->p->ca_file && (endpoint || fp_same_origin(url, x->p->base_url)))
        up_trust_only(h, x->p->ca_file);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, j->timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, x->p->connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)x->cap);
    curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, open_checked);
    curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, x);
    cg_install(h);
    x->easy = h;
    /* One exchange on a connection at a time, as the provider's calls: a connection shared by
     * several streams (HTTP/2) always has bytes waiting for one of them (connguard.h), and is
     * kept when a transfer on it is abandoned. */
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_PREREQFUNCTION, send_checked);
    curl_easy_setopt(h, CURLOPT_PREREQDATA, x);
    /* A provider's create may reuse this connection: it ends with a reset like theirs. */
    up_reset_on_close(h);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    if (credential) {
        /* The provider's own content endpoint: its credential, read now, never stored. */
        char *secret = secret_get(credential);
        if (secret && x->p->auth_header && prov_secret_ok(secret)) {
            size_t n = strlen(x->p->auth_header) +
                       strlen(x->p->auth_prefix ? x->p->auth_prefix : "") + strlen(secret) + 4;
            j->auth = malloc(n);
            if (j->auth) {
                snprintf(j->auth, n, "%s: %s%s", x->p->auth_header,
                         x->p->auth_prefix ? x->p->auth_prefix : "", secret);
                j->hdrs = curl_slist_append(j->hdrs, j->auth);
            }
        }
        secret_free(secret);
        for (size_t i = 0; x->p->headers && x->p->headers[i] && x->p->headers[i + 1]; i += 2) {
            char line[1024];
            snprintf(line, sizeof(line), "%s: %s", x->p->headers[i], x->p->headers[i + 1]);
            j->hdrs = curl_slist_append(j->hdrs, line);
        }
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, j->hdrs);
    }
    j->h = h;
    return 0;
}

/* Reads how j->h ended (j->curl_code) and frees it: the status, or -1 (x.why); *redirect gets
 * the Location of a 3xx. */
static long get_finish(struct arch_job *j, char **redirect)
{
    struct copy *x = &j->x;
    CURL *h = j->h;
    long status = 0;
    *redirect = NULL;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    char *ct = NULL, *loc = NULL;
    curl_easy_getinfo(h, CURLINFO_CONTENT_TYPE, &ct);
    curl_easy_getinfo(h, CURLINFO_REDIRECT_URL, &loc);
    if (ct && status >= 200 && status < 300) /* a redirect's own type is not the object's */
        snprintf(x->content_type, sizeof(x->content_type), "%s", ct);
    if (loc && status >= 300 && status < 400)
        *redirect = strdup(loc);
    CURLcode rc = (CURLcode)j->curl_code;
    if (rc != CURLE_OK) {
        status = -1;
        /* A refused address ends the copy only when no connection was made (every address
         * refused, or a reused one): one refused before libcurl fell back to an allowed one
         * says nothing of a later timeout or reset on that one, which is tried again. */
        if (x->refused_addr && (rc == CURLE_COULDNT_CONNECT || rc == CURLE_ABORTED_BY_CALLBACK)) {
            x->permanent = 1;
            snprintf(x->why, sizeof(x->why), "address %s is %s: refused (archive.allow_private)",
                     x->refused_ip, fp_addr_class_name(x->refused_class));
        } else if (x->too_big || rc == CURLE_FILESIZE_EXCEEDED) {
            x->permanent = 1;
            snprintf(x->why, sizeof(x->why), "larger than archive.max_bytes (%lld)", x->cap);
        } else if (rc == CURLE_PARTIAL_FILE) {
            snprintf(x->why, sizeof(x->why),
                     "the body was shorter than its Content-Length (%lld bytes received)",
                     x->tmp.bytes);
        } else {
            snprintf(x->why, sizeof(x->why), "fetch: %s", curl_easy_strerror(rc));
        }
    }
    curl_easy_cleanup(h);
    j->h = NULL;
    headers_free(j);
    return status;
}

/* Decodes output n's base64 (from the stored result) into x->tmp. */
static int copy_b64(struct copy *x, const PGresult *r, int n, const char *remote)
{
    unsigned char *body = NULL;
    size_t len = 0;
    struct ap_plan pl;
    int rc = -1;
    (void)db_bytea_decode(db_val(r, 0, AC_BODY), &body, &len);
    if (ap_plan_outputs(x->p, (const char *)body, len, NULL, remote, 0, &pl) < 0) {
        snprintf(x->why, sizeof(x->why), "out of memory");
        free(body);
        return -1;
    }
    if ((size_t)n >= pl.n || pl.out[n].kind != AP_B64) {
        x->permanent = 1;
        snprintf(x->why, sizeof(x->why), "the stored result no longer holds this output");
        goto done;
    }
    if (pl.out[n].content_type)
        snprintf(x->content_type, sizeof(x->content_type), "%s", pl.out[n].content_type);
    const char *s = pl.out[n].b64;
    size_t left = strlen(s);
    EVP_ENCODE_CTX *ctx = EVP_ENCODE_CTX_new();
    /* EVP_DecodeUpdate writes what k characters decode to plus what the up to 64 held over
     * from the call before complete: at most (k + 64) / 4 * 3 bytes (a chunk as large as the
     * buffer's 4/3, with whitespace held over, overflowed it by up to 45 bytes). */
    enum { B64_CHUNK = 49152 };
    unsigned char out[49152];
    _Static_assert((B64_CHUNK + 64) / 4 * 3 <= sizeof(out), "a chunk's decoding fits out");
    /* Only what the output is makes a failure permanent (not base64, too big): a spool that
     * could not be written (a full disk) or a context not allocated is tried again — these
     * bytes never expire, and were given up for good as "not valid base64". */
    int outl = 0, decoded = 1, have_ctx = ctx != NULL, stored = have_ctx;
    if (stored)
        EVP_DecodeInit(ctx);
    while (decoded && stored && left) {
        int k = left > B64_CHUNK ? B64_CHUNK : (int)left;
        if (EVP_DecodeUpdate(ctx, out, &outl, (const unsigned char *)s, k) < 0)
            decoded = 0;
        else if (outl && put(x, out, (size_t)outl) < 0)
            stored = 0;
        s += k;
        left -= (size_t)k;
    }
    if (decoded && stored) {
        if (EVP_DecodeFinal(ctx, out, &outl) != 1)
            decoded = 0;
        else if (outl && put(x, out, (size_t)outl) < 0)
            stored = 0;
    }
    EVP_ENCODE_CTX_free(ctx);
    if (!decoded || x->too_big) {
        x->permanent = 1;
        snprintf(x->why, sizeof(x->why),
                 x->too_big ? "larger than archive.max_bytes" : "the output is not valid base64");
        goto done;
    }
    if (!stored) {
        snprintf(x->why, sizeof(x->why), "the archive could not spool it (%s)",
                 have_ctx ? "a write failed" : "out of memory");
        goto done;
    }
    rc = 0;
done:
    ap_plan_fini(&pl);
    free(body);
    return rc;
}

/* The copies' ends a thread has written but not yet sent: each thread sends them together, in
 * one transaction and one round trip (fin_flush) — after the outputs of a claim were started,
 * after a turn of ended GETs — where each was a statement and a commit of its own (in `make
 * bench`'s end-to-end run, where every output is refused by policy, one commit per job). A copy
 * ends once, under its own lease: two threads' batches never write the same row. */
#define FIN_MAX 64
struct fin_row {
    long long tenant_id, lease_version, delay_ms, bytes;
    double lease_end; /* when the row's claim runs out (clock_mono() seconds) */
    int n;
    int untried; /* given back before any GET: its claim's attempt is not counted */
    char state[16];
    char *op_id, *error, *sha, *ct; /* owned */
};
static _Thread_local struct fin_row fin[FIN_MAX];
static _Thread_local size_t fin_n;
static _Thread_local double fin_since; /* when the oldest buffered end was buffered */

/* A buffered end waits at most FIN_WAIT_S, and never until its lease is within FIN_MARGIN_S of
 * its end: the copies concluded after it (an fsync, an upload each) must not keep it until
 * another worker may claim its row — a fenced write then finds the row taken, and a copy that
 * was stored would be made again, or, its URL expired by then, written failed. */
#define FIN_WAIT_S 1.0
#define FIN_MARGIN_S 2.0

#define FIN_PARAMS 13
static void fin_params(const struct fin_row *f, char nbuf[16], struct param ps[FIN_PARAMS])
{
    snprintf(nbuf, 16, "%d", f->n);
    const struct param p[FIN_PARAMS] = {
        p_int("tenant_id", f->tenant_id),
        p_text("op_id", f->op_id),
        p_text("n", nbuf),
        p_int("lease_version", f->lease_version),
        p_text("state", f->state),
        p_text_lossy("error", f->error),
        p_int("delay_ms", f->delay_ms),
        p_text("sha256", f->sha),
        f->bytes >= 0 ? p_int("bytes", f->bytes) : p_null("bytes"),
        p_text("content_type", f->ct),
        p_text("backend", f->sha ? blob_backend(g_blob) : NULL),
        p_text("stored_by", f->sha ? g_cfg->instance_id : NULL),
        p_text("untried", f->untried ? "true" : "false")};
    memcpy(ps, p, sizeof(p));
}

/* Says what became of one written end (applied: the row was still under its claim). */
static void fin_said(const struct fin_row *f, int applied)
{
    if (!applied) {
        LOG(LOG_WARN, "archive_write_dropped", LS("job_id", f->op_id), LI("output", f->n),
            LS("state", f->state));
        return;
    }
    if (!strcmp(f->state, "archived"))
        metrics_archive(0);
    else if (!strcmp(f->state, "expired"))
        metrics_archive(2);
    else if (strcmp(f->state, "pending") != 0)
        metrics_archive(1);
}

/* Whether the end of f was written by an earlier try whose commit's fate was lost. */
static int fin_found_written(struct db *db, struct param ps[FIN_PARAMS])
{
    PGresult *r;
    if (db_run(db, &end_written, ps, 5, &r) != STORE_OK)
        return 0;
    int found = PQntuples(r) == 1;
    PQclear(r);
    return found;
}

/* Writes one end. lost: an earlier try (the batch, or this row's first write) lost its
 * connection and may have committed: a fenced rewrite that finds the row ended then asks
 * whether that end is this one — written once, counted once, never reported dropped. Returns
 * -1, saying nothing, when an archived end (its object stored) could not reach the database
 * at all and keep is set: the caller keeps it to write again. */
static int fin_one(struct db *db, const struct fin_row *f, int lost, int keep)
{
    char nbuf[16];
    struct param ps[FIN_PARAMS];
    fin_params(f, nbuf, ps);
    PGresult *r;
    int e = db_run(db, &finish, ps, FIN_PARAMS, &r);
    if (e == STORE_EUNAVAIL && !lost) { /* the fate of this write is unknown: once more */
        lost = 1;
        e = db_run(db, &finish, ps, FIN_PARAMS, &r);
    }
    if (e == STORE_EUNAVAIL && keep && f->sha && !strcmp(f->state, "archived"))
        return -1;
    int applied = e == STORE_OK && PQntuples(r) == 1;
    if (e == STORE_OK)
        PQclear(r);
    if (!applied && lost && e == STORE_OK && strcmp(f->state, "pending") != 0 &&
        fin_found_written(db, ps)) {
        LOG(LOG_INFO, "archive_end_found_written", LS("job_id", f->op_id), LI("output", f->n),
            LS("state", f->state));
        applied = 1;
    }
    fin_said(f, applied);
    return applied;
}

static int fin_cmp(const void *a, const void *b)
{
    const struct fin_row *x = a, *y = b;
    if (x->tenant_id != y->tenant_id)
        return x->tenant_id < y->tenant_id ? -1 : 1;
    int c = strcmp(x->op_id, y->op_id);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static void fin_free(struct fin_row *f)
{
    free(f->op_id);
    free(f->error);
    free(f->sha);
    free(f->ct);
    memset(f, 0, sizeof(*f));
}

/* Sends this thread's written ends: one alone as it is; more as one statement (db_run_rows, in
 * key order), and one by one when that fails (a lost connection may have committed them: a
 * fenced write that finds its row ended already changes nothing, fin_one then finds the end
 * written, and the lease keeps an unwritten one for a later claim). */
static void fin_flush(struct db *db)
{
    size_t n = fin_n;
    if (n == 0)
        return;
    int done = 0, lost = 0;
    if (n > 1) {
        qsort(fin, n, sizeof(fin[0]), fin_cmp);
        char nbufs[FIN_MAX][16];
        struct param ps[FIN_MAX][FIN_PARAMS];
        const struct param *rows[FIN_MAX];
        PGresult *outs[FIN_MAX];
        for (size_t i = 0; i < n; i++) {
            fin_params(&fin[i], nbufs[i], ps[i]);
            rows[i] = ps[i];
        }
        int e = db_run_rows(db, &finish_rows, &finish, n, rows, FIN_PARAMS, outs);
        if (e == STORE_OK) {
            for (size_t i = 0; i < n; i++) {
                fin_said(&fin[i], PQntuples(outs[i]) == 1);
                PQclear(outs[i]);
            }
            done = 1;
        }
        lost = e == STORE_EUNAVAIL;
    }
    /* An archived end the database could not take at all is kept and written again with the
     * thread's next ends (half the buffer at most): its object is stored, and an archived end
     * is written whatever became of its claim (archive_finish). Dropped, the output was
     * claimed and fetched again — from a URL that may have expired by then, its stored object
     * then named by no row. */
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (!done && fin_one(db, &fin[i], lost, kept < FIN_MAX / 2) < 0) {
            fin[i].lease_end = DBL_MAX; /* due by its wait alone: its lease is over */
            fin[kept++] = fin[i];
            continue;
        }
        fin_free(&fin[i]);
    }
    if (kept)
        LOG(LOG_WARN, "archive_ends_kept", LI("ends", (long long)kept),
            LS("note", "the database could not be reached: written again with the next ends"));
    fin_n = kept;
    fin_since = clock_mono();
}

/* Sends the buffered ends now when one has waited FIN_WAIT_S or its lease is near its end. */
static void fin_flush_due(struct db *db)
{
    if (fin_n == 0)
        return;
    double first_end = fin[0].lease_end;
    for (size_t i = 1; i < fin_n; i++)
        first_end = fin[i].lease_end < first_end ? fin[i].lease_end : first_end;
    if (ap_ends_due(clock_mono(), fin_since, first_end, FIN_WAIT_S, FIN_MARGIN_S))
        fin_flush(db);
}

/* A copy's end, written under the claim that made it (fencing); sent with the thread's batch. */
static void write_end(struct db *db, const struct store_claim *c, double lease_end, int n,
                      const char *state, const char *error, long long delay_ms, const char *sha,
                      long long bytes, const char *ct, int untried)
{
    if (fin_n == FIN_MAX)
        fin_flush(db);
    struct fin_row *f = &fin[fin_n];
    *f = (struct fin_row){.tenant_id = c->tenant_id, .lease_version = c->lease_version,
                          .delay_ms = delay_ms, .bytes = bytes, .n = n, .lease_end = lease_end,
                          .untried = untried};
    snprintf(f->state, sizeof(f->state), "%s", state);
    f->op_id = strdup(c->id);
    f->error = error ? strdup(error) : NULL;
    f->sha = sha ? strdup(sha) : NULL;
    f->ct = ct ? strdup(ct) : NULL;
    if (!f->op_id || (error && !f->error) || (sha && !f->sha) || (ct && !f->ct)) {
        fin_free(f); /* out of memory: its lease ends and the output is claimed again */
        LOG(LOG_WARN, "archive_write_dropped", LS("job_id", c->id), LI("output", n),
            LS("state", state));
        return;
    }
    if (fin_n++ == 0)
        fin_since = clock_mono();
    fin_flush_due(db);
}

static void write_finish(struct db *db, const struct store_claim *c, double lease_end, int n,
                         const char *state, const char *error, long long delay_ms,
                         const char *sha, long long bytes, const char *ct)
{
    write_end(db, c, lease_end, n, state, error, delay_ms, sha, bytes, ct, 0);
}

static void job_free(struct arch_job *j)
{
    atomic_fetch_sub(&j->A->copying, 1);
    if (j->h)
        curl_easy_cleanup(j->h);
    headers_free(j);
    free(j->cur);
    store_claim_fini(&j->c);
    free(j);
}

/* The copy ended (rc 0: its bytes are in the temporary file): they are published under their
 * hash and the output written archived, or the failure is written (retried, expired or failed
 * as ap_after_failure decides). Frees the job. */
static void conclude(struct db *db, struct arch_job *j, int rc)
{
    struct copy *x = &j->x;
    const struct store_claim *c = &j->c;
    char sha[65] = "";
    int existed = 0, store = 0;
    fin_flush_due(db); /* before an fsync or an upload: the ends buffered do not wait for it */
    if (rc == 0) {
        if (!*x->content_type)
            snprintf(x->content_type, sizeof(x->content_type), "%s", sniff(x->head, x->head_len));
        rc = blob_tmp_commit(g_blob, &x->tmp, x->content_type, sha, &existed, x->why,
                             sizeof(x->why));
        store = rc != 0; /* the bytes were read: the store refused them */
    } else {
        blob_tmp_abort(&x->tmp);
    }
    if (rc == 0) {
        LOG(LOG_INFO, "archived", LS("job_id", c->id), LS("provider", c->provider),
            LI("output", j->n), LI("bytes", x->tmp.bytes), LS("sha256", sha),
            LI("already_stored", existed));
        write_finish(db, c, j->lease_end, j->n, "archived", NULL, 0, sha, x->tmp.bytes,
                     x->content_type);
        job_free(j);
        return;
    }
    long long d;
    if (x->stopped) {
        snprintf(x->why, sizeof(x->why), "this replica stopped during the copy: given back");
        LOG(LOG_INFO, "archive_copy_given_back", LS("job_id", c->id), LS("provider", c->provider),
            LI("output", j->n));
        write_finish(db, c, j->lease_end, j->n, "pending", x->why, 0, NULL, -1, NULL);
        job_free(j);
        return;
    }
    /* Judged at the failure's time, not the claim's: a copy that ran most of its lease must not
     * have its last try before the URL's expiry planned from a clock a minute old. */
    double failed_at = j->now + (clock_mono() - j->claimed);
    enum ap_verdict v =
        ap_after_failure(j->attempts, failed_at, j->expires, x->permanent && !store, store,
                         clock_rand01(), &d);
    const char *st = v == AP_RETRY ? "pending" : v == AP_EXPIRED ? "expired" : "failed";
    LOG(v == AP_RETRY ? LOG_INFO : LOG_WARN, "archive_copy_failed", LS("job_id", c->id),
        LS("provider", c->provider), LI("output", j->n), LI("attempts", j->attempts),
        LS("state", st), LS("error", x->why));
    write_finish(db, c, j->lease_end, j->n, st, x->why, d, NULL, -1, NULL);
    job_free(j);
}

static void on_get_end(void *arg, int curl_code);

/* Starts the GET of j->cur on the engine: on the slot its claim took (first), or on one taken now
 * for a redirect's next hop. -1 (x.why) when it cannot be made (a first slot is given back). */
static int get_start(struct arch_job *j, int first)
{
    /* A content endpoint's hop is read as one (its credential, its origin's CA and scheme)
     * only on the provider's own origin: a redirect off it (a signed storage URL on a declared
     * host) never carries the provider's credential. */
    int endpoint = j->kind == AP_ENDPOINT && fp_same_origin(j->cur, j->p->base_url);
    const char *credential = endpoint ? db_val(j->c.res, 0, AC_CREDENTIAL) : NULL;
    if (get_prepare(j, j->cur, endpoint, credential) < 0) {
        if (first)
            eng_release(j->A->eng, -1);
        return -1;
    }
    if (!first)
        eng_acquire_more(j->A->eng);
    eng_submit_easy_ticked(j->A->eng, -1, j->h, on_get_end, j, copy_tick, &j->x);
    return 0;
}

/* Runs on an engine thread: the GET ended; an archive thread reads how. */
static void on_get_end(void *arg, int curl_code)
{
    struct arch_job *j = arg;
    j->curl_code = curl_code;
    rq_push(j->A->results, &j->node);
}

/* An archive thread reads how a GET ended: the copy is done, a redirect on the same origin is
 * followed (into a fresh temporary file: the redirect's body is not the output), or it failed. */
static void write_job(struct rq_item *it, struct db *db)
{
    struct arch_job *j = (struct arch_job *)it;
    struct copy *x = &j->x;
    char *redirect = NULL, *next = NULL;
    long st = get_finish(j, &redirect);
    /* Only a 200 is the whole output: a 204 has none, a 206 is a part of it. */
    if (st == 200) {
        free(redirect);
        conclude(db, j, 0);
        return;
    }
    if (st >= 300 && st < 400 && redirect) {
        char why[256];
        struct fp_policy pol = archprof_policy(j->p->archive);
        if (!fp_redirect_allowed(&pol, j->cur, redirect, &next, why, sizeof(why))) {
            x->permanent = 1; /* the configuration's verdict: never worth another try */
            snprintf(x->why, sizeof(x->why), "%s", why);
        } else if (j->hop + 1 >= MAX_REDIRECTS) {
            snprintf(x->why, sizeof(x->why), "more than %d redirects", MAX_REDIRECTS);
        } else if ((j->timeout_ms = ap_copy_timeout_ms(j->p->archive->timeout_ms, clock_mono(),
                                                       j->lease_end, COPY_MARGIN_S)) == 0) {
            /* Each hop within what the claim's lease has left, as the first was. */
            snprintf(x->why, sizeof(x->why), "the claim's lease ran out during its redirects");
        } else {
            blob_tmp_abort(&x->tmp);
            x->head_len = 0;
            if (blob_tmp_open(g_blob, &x->tmp, why, sizeof(why)) < 0) {
                snprintf(x->why, sizeof(x->why), "%s", why);
            } else {
                free(j->cur);
                j->cur = next;
                j->hop++;
                free(redirect);
                if (get_start(j, 0) < 0)
                    conclude(db, j, -1);
                return;
            }
        }
        free(next);
    } else if (st > 0) {
        snprintf(x->why, sizeof(x->why), "the output URL answered HTTP %ld", st);
    }
    free(redirect);
    conclude(db, j, -1);
}

/* Concludes a claimed output that cannot be copied now (its engine slot given back). */
static void not_copied(struct archiver *A, struct db *db, const struct store_claim *c,
                       double lease_end, int n, const char *state, const char *why,
                       long long delay_ms)
{
    eng_release(A->eng, -1);
    write_finish(db, c, lease_end, n, state, why, delay_ms, NULL, -1, NULL);
}

/* Gives back a claimed output no GET was made for (its engine slot given back): pending, due
 * after delay_ms, its claim's attempt not counted — only a claim that reached the provider's URL
 * counts towards its expiry (ap_expired_untried) or its last try. */
static void give_back(struct archiver *A, struct db *db, const struct store_claim *c,
                      double lease_end, int n, const char *why, long long delay_ms)
{
    eng_release(A->eng, -1);
    LOG(LOG_INFO, "archive_given_back_untried", LS("job_id", c->id), LS("provider", c->provider),
        LI("output", n), LS("reason", why));
    write_end(db, c, lease_end, n, "pending", why, delay_ms, NULL, -1, NULL, 1);
}

/* Starts the copy of a claimed output (c->res holds its row alone; its engine slot taken):
 * refused and expired outputs are concluded here, base64 ones decoded here; a URL or content
 * endpoint is read by the engine. */
static void archive_row(const struct cfg *cfg, struct db *db, struct store_claim *c,
                        double lease_end, struct archiver *A)
{
    const PGresult *r = c->res;
    int n = atoi(PQgetvalue(r, 0, AC_N));
    int attempts = atoi(PQgetvalue(r, 0, AC_ATTEMPTS));
    int kind = ap_kind_parse(db_val(r, 0, AC_KIND));
    double expires = atof(PQgetvalue(r, 0, AC_EXPIRES)), now = atof(PQgetvalue(r, 0, AC_NOW));
    const struct cfg_provider *p = cfg_find_provider(cfg, c->provider, strlen(c->provider));
    if (!p || !p->archive) {
        give_back(A, db, c, lease_end, n, "the provider is not configured on this replica",
                  NOT_HERE_DELAY_MS);
        return;
    }
    if (ap_expired_untried(attempts, now, expires)) {
        /* Counted and said, never dropped in silence. */
        LOG(LOG_WARN, "archive_expired", LS("job_id", c->id), LS("provider", c->provider),
            LI("output", n), LI("attempts", attempts));
        not_copied(A, db, c, lease_end, n, "expired", "the provider's URL expired before it was copied", 0);
        return;
    }
    char why[512];
    struct fp_policy pol = archprof_policy(p->archive);
    if (kind != AP_B64 &&
        fp_url_allowed(&pol, db_val(r, 0, AC_URL), kind == AP_ENDPOINT ? p->base_url : NULL, why,
                       sizeof(why)) < 0) {
        /* Refused before anything is opened or fetched: never worth another try. */
        LOG(LOG_WARN, "archive_refused", LS("job_id", c->id), LS("provider", c->provider),
            LI("output", n), LS("error", why));
        not_copied(A, db, c, lease_end, n, "failed", why, 0);
        return;
    }
    struct arch_job *j = calloc(1, sizeof(*j));
    if (!j) {
        give_back(A, db, c, lease_end, n, "out of memory", 1000);
        return;
    }
    *j = (struct arch_job){.A = A, .c = *c, .p = p, .n = n, .attempts = attempts, .kind = kind,
                           .expires = expires, .now = now, .claimed = clock_mono(),
                           .lease_end = lease_end};
    atomic_fetch_add(&A->copying, 1);
    memset(c, 0, sizeof(*c)); /* the job owns the claim now */
    j->node.write = write_job;
    j->x.p = p;
    j->x.cap = p->archive->max_bytes;
    j->x.stopping = &A->quiesced;
    if (blob_tmp_open(g_blob, &j->x.tmp, j->x.why, sizeof(j->x.why)) < 0) {
        /* The store, not the output: never expired or failed for it (no GET was made). */
        give_back(A, db, &j->c, lease_end, n, j->x.why, ap_store_retry_ms(clock_rand01()));
        job_free(j);
        return;
    }
    if (kind != AP_URL && kind != AP_ENDPOINT) {
        eng_release(A->eng, -1); /* nothing to fetch: the bytes are in the stored result */
        conclude(db, j,
                 kind == AP_B64 ? copy_b64(&j->x, j->c.res, n, db_val(j->c.res, 0, AC_REMOTE))
                                : -1);
        return;
    }
    /* A copy never outlives the claim's lease, which its batch's rows share (another worker may
     * take the row after it): a row started too late waits for a later claim. */
    j->timeout_ms = ap_copy_timeout_ms(p->archive->timeout_ms, clock_mono(), lease_end,
                                       COPY_MARGIN_S);
    if (j->timeout_ms == 0) {
        blob_tmp_abort(&j->x.tmp);
        give_back(A, db, &j->c, lease_end, n, "the claim's lease ran out before the copy began",
                  1000);
        job_free(j);
        return;
    }
    if (!(j->cur = strdup(db_val(j->c.res, 0, AC_URL)))) {
        eng_release(A->eng, -1);
        snprintf(j->x.why, sizeof(j->x.why), "out of memory");
        conclude(db, j, -1);
        return;
    }
    if (get_start(j, 1) < 0)
        conclude(db, j, -1);
}

/* Starts the copies of one claim's outputs (a slot taken for each), one row at a time: each
 * becomes a claim of its own, owned by its copy until the copy's end is written. */
static void archive_one(const struct cfg *cfg, struct db *db, struct store_claim *c,
                        double claimed_mono, void *arg)
{
    struct archiver *A = arg;
    int rows = PQntuples(c->res);
    double lease_end = claimed_mono + archive_lease_s(cfg); /* every row's: one a claim */
    if (rows == 1) /* a row alone is worked on as claimed: no copy */
        archive_row(cfg, db, c, lease_end, A);
    /* The fetches first (each started, not waited for), the base64 output (decoded and stored
     * here, at most one a claim) last: its work does not eat into the others' lease. */
    for (int k = 0; rows > 1 && k < 2 * rows; k++) {
        int i = k % rows;
        if ((k < rows) == (ap_kind_parse(db_val(c->res, i, AC_KIND)) == AP_B64))
            continue;
        struct store_claim one = {.res = db_result_row(c->res, i)};
        if (!one.res) {
            /* Out of memory: its lease ends and the output is claimed again then. */
            eng_release(A->eng, -1);
            continue;
        }
        one.tenant_id = atoll(PQgetvalue(one.res, 0, AC_TENANT));
        one.id = db_val(one.res, 0, AC_OP);
        one.lease_version = atoll(PQgetvalue(one.res, 0, AC_LEASE_VERSION));
        one.provider = db_val(one.res, 0, AC_PROVIDER);
        archive_row(cfg, db, &one, lease_end, A);
        store_claim_fini(&one); /* nothing left when a copy took it */
    }
    atomic_fetch_sub(&A->to_start, claimed_rows);
    claimed_rows = 0;
    arch_room(A); /* a thread that found no room while this one held it claims again now */
    fin_flush(db);
}

/* The room left for up to most copies, less held (what the claims being made hold): a row
 * started counts in `copying` too until its claim's room is given back (the bound errs low,
 * never high). Nor more than the engine's free slots less those same holds (their rows' slots
 * are taken once claimed): threads claiming at once do not each count the same free slots
 * (ENG_ROOM_THEN_TAKE). */
static int room_left(struct archiver *A, int held, int most)
{
    int room = A->cfg->archive_max_inflight - atomic_load(&A->copying) -
               atomic_load(&A->to_start) - held;
    return ap_claim_room(room, eng_room(A->eng) - held, most);
}

/* Holds up to most of the room among the claims being made (0: none): whoever holds it — a
 * claim, a result's born claims — never takes more than archive_max_inflight with the others. */
static int hold(struct archiver *A, int most)
{
    int held = atomic_load(&A->claiming), room;
    do {
        if ((room = room_left(A, held, most)) <= 0)
            return 0;
    } while (!atomic_compare_exchange_weak(&A->claiming, &held, held + room));
    return room;
}

/* Holds room for a claim (0: none, and the archive is starved until a claim finds room). */
static int hold_room(struct archiver *A)
{
    int room = hold(A, CLAIM_BATCH);
    atomic_store(&A->starved, room == 0);
    return room;
}

/* Claims pending outputs, as many as the engine has room for (and archive_max_inflight, and
 * CLAIM_BATCH), and the spool for their files. */
static int claim_with_room(struct db *db, const char *owner, int lease_seconds,
                           struct store_claim *out, void *arg)
{
    struct archiver *A = arg;
    (void)lease_seconds; /* the archive's own (archive_lease_s) */
    struct claim_args a = {
        .owner = owner, .lease_seconds = archive_lease_s(A->cfg), .out = out, .A = A};
    memset(out, 0, sizeof(*out));
    /* Full already: not even a look for due work (the hold itself is taken by claim_tenant). */
    if (room_left(A, atomic_load(&A->claiming), CLAIM_BATCH) <= 0) {
        atomic_store(&A->starved, 1);
        return STORE_ENOTFOUND; /* a call's end wakes a thread to claim again */
    }
    /* Room again: the next slot given back need not wake a claim (hold_room sets it again when
     * a claim of due outputs finds none; born claims wait while it is set). */
    atomic_store(&A->starved, 0);
    plan_due(db);
    int e = turns_claim(&claim_turns, db, claim_due_read, claim_tenant, &a);
    int room = a.room;
    if (a.full && e == STORE_ERETRY)
        e = STORE_ENOTFOUND; /* full: a call's end wakes a thread to claim again */
    if (e != STORE_OK) {
        if (room) {
            atomic_fetch_sub(&A->claiming, room);
            arch_room(A);
        }
        return e;
    }
    /* The rows' engine slots taken, the claim's hold becomes its rows' until they are started
     * (in that order: the bounds err low in between, never high). */
    int rows = PQntuples(out->res);
    for (int i = rows; i > 0; i--) {
        eng_acquire_more(A->eng);
        metrics_archive_claimed(0);
    }
    atomic_fetch_add(&A->to_start, rows);
    atomic_fetch_sub(&A->claiming, room);
    claimed_rows = rows; /* given back by archive_one, which the pool calls next on this thread */
    return e;
}

/* ---- born claims (archive.h) --------------------------------------------------------- */

/* Room for up to want born outputs, taken as a claim takes it — held first among the claims
 * being made (so that neither passes archive_max_inflight nor counts the engine's free slots
 * twice), the slots taken, then counted as rows to start: how many. None while a claim found the
 * archive full (starved): outputs already due — retries, a dead replica's, those no write could
 * take — have the room first, in the tenants' turns; the new ones are then inserted unclaimed
 * and wait their turn. */
static int born_take(int want)
{
    struct archiver *A = atomic_load(&g_arch);
    int room;
    if (!A || want <= 0 || atomic_load(&A->quiesced) || atomic_load(&A->starved) ||
        !(room = hold(A, want)))
        return 0;
    for (int i = 0; i < room; i++)
        eng_acquire_more(A->eng);
    atomic_fetch_add(&A->to_start, room);
    atomic_fetch_sub(&A->claiming, room);
    return room;
}

static void born_give(struct archiver *A, int k)
{
    if (!A || k <= 0)
        return;
    for (int i = 0; i < k; i++)
        eng_release(A->eng, -1);
    atomic_fetch_sub(&A->to_start, k);
    arch_room(A);
}

/* A write's born outputs on their way to an archive thread. */
struct born_rows {
    struct rq_item node;
    struct archiver *A;
    long long tenant_id;
    char *job_id, *provider, *remote_id, *plan, *inserted;
    int n;          /* how many outputs inserted names: their slots are held */
    double lease_end; /* clock_mono() */
};

static void born_rows_free(struct born_rows *b)
{
    free(b->job_id);
    free(b->provider);
    free(b->remote_id);
    free(b->plan);
    free(b->inserted);
    free(b);
}

/* Output n of the plan as a claim's row (the AC_ columns): fencing token 1, one attempt. */
static PGresult *born_row(const struct born_rows *b, const cJSON *x, double now)
{
    static const char *const names[] = {"tenant_id", "op_id", "n", "lease_version", "provider",
                                        "kind", "source_url", "credential", "expires",
                                        "claimed_at", "attempts", "resp_body", "remote_id"};
    PGresAttDesc attrs[sizeof(names) / sizeof(names[0])];
    memset(attrs, 0, sizeof(attrs));
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        attrs[i].name = (char *)names[i];
        attrs[i].typid = 25; /* text: every value is read as text */
        attrs[i].typlen = -1;
        attrs[i].atttypmod = -1;
    }
    char tenant[24], n[16], expires[32], at[32];
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(x, "expires");
    snprintf(tenant, sizeof(tenant), "%lld", b->tenant_id);
    const cJSON *num = cJSON_GetObjectItemCaseSensitive(x, "n");
    snprintf(n, sizeof(n), "%d", cJSON_IsNumber(num) ? num->valueint : -1);
    snprintf(expires, sizeof(expires), "%.6f", cJSON_IsNumber(e) ? e->valuedouble : 0.0);
    snprintf(at, sizeof(at), "%.6f", now);
    const char *v[] = {tenant,
                       b->job_id,
                       n,
                       "1",
                       b->provider,
                       cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "kind")),
                       cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "url")),
                       cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "credential")),
                       expires,
                       at,
                       "1",
                       NULL,
                       b->remote_id};
    PGresult *r = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    if (!r || !PQsetResultAttrs(r, (int)(sizeof(attrs) / sizeof(attrs[0])), attrs))
        goto failed;
    for (int c = 0; c < (int)(sizeof(v) / sizeof(v[0])); c++)
        if (!PQsetvalue(r, 0, c, (char *)v[c], v[c] ? (int)strlen(v[c]) : -1))
            goto failed;
    return r;
failed:
    PQclear(r);
    return NULL;
}

/* Starts the copies of a write's born outputs on an archive thread, as archive_one starts a
 * claim's rows (each slot was taken by born_take). Once the archive is stopping, each is given
 * back pending and due at once (its end is written under the born lease): any replica takes it. */
static void start_born(struct rq_item *it, struct db *db)
{
    struct born_rows *b = (struct born_rows *)it;
    struct archiver *A = b->A;
    cJSON *plan = cJSON_Parse(b->plan);
    double now = clock_wall();
    int started = 0;
    for (const char *s = b->inserted; s && *s && started < b->n;) {
        char *end;
        long n = strtol(s, &end, 10);
        s = *end == ',' ? end + 1 : end + (*end != 0);
        const cJSON *x = NULL;
        cJSON_ArrayForEach(x, plan)
        {
            const cJSON *num = cJSON_GetObjectItemCaseSensitive(x, "n");
            if (cJSON_IsNumber(num) && num->valueint == n)
                break;
        }
        struct store_claim one = {.res = x ? born_row(b, x, now) : NULL};
        started++;
        if (!one.res) {
            /* Not in the plan, or out of memory: its lease runs out and a claim takes it. */
            LOG(LOG_WARN, "archive_born_dropped", LS("job_id", b->job_id), LI("output", n));
            born_give(A, 1);
            continue;
        }
        one.tenant_id = b->tenant_id;
        one.id = db_val(one.res, 0, AC_OP);
        one.lease_version = 1;
        one.provider = db_val(one.res, 0, AC_PROVIDER);
        if (atomic_load(&A->quiesced)) {
            give_back(A, db, &one, b->lease_end, (int)n,
                      "the replica stopped before the copy began", 0);
        } else {
            metrics_archive_claimed(1);
            archive_row(A->cfg, db, &one, b->lease_end, A);
        }
        store_claim_fini(&one); /* nothing left when a copy took it */
        atomic_fetch_sub(&A->to_start, 1);
    }
    born_give(A, b->n - started); /* named but not found in the answer: given back */
    arch_room(A);
    cJSON_Delete(plan);
    born_rows_free(b);
}

void archive_born_settle(struct archive_born *b, int written, long long tenant_id,
                         const char *job_id, const char *provider, const char *remote_id,
                         const char *plan)
{
    struct archiver *A = atomic_load(&g_arch);
    int handed = 0;
    if (b->taken > 0 && written && b->inserted && *b->inserted && A) {
        for (const char *s = b->inserted; *s; s++)
            handed += *s == ',';
        handed++;
        handed = handed < b->taken ? handed : b->taken;
        struct born_rows *r = calloc(1, sizeof(*r));
        if (r) {
            *r = (struct born_rows){.A = A,
                                   .tenant_id = tenant_id,
                                   .job_id = strdup(job_id),
                                   .provider = strdup(provider),
                                   .remote_id = remote_id ? strdup(remote_id) : NULL,
                                   .plan = strdup(plan),
                                   .inserted = b->inserted,
                                   .n = handed,
                                   .lease_end = b->mono + archive_lease_s(A->cfg)};
            b->inserted = NULL;
        }
        if (!r || !r->job_id || !r->provider || !r->plan || (remote_id && !r->remote_id)) {
            /* Out of memory: their leases run out and a claim takes them. */
            if (r)
                born_rows_free(r);
            handed = 0;
        } else {
            r->node.write = start_born;
            rq_push(A->results, &r->node);
        }
    }
    born_give(A, b->taken - handed);
    free(b->inserted);
    *b = (struct archive_born){0};
}

static int arch_starved(void *arg)
{
    return atomic_load(&((struct archiver *)arg)->starved);
}

/* A slot was given back (by any pool's call): a claim that found the engine full is made again. */
static void arch_room(void *arg)
{
    struct archiver *A = arg;
    if (atomic_load(&A->starved))
        rq_kick(A->results);
}

static int write_results(struct db *db, void *arg)
{
    struct archiver *A = arg;
    int n = rq_run(A->results, db, RESULTS_PER_TURN);
    fin_flush(db);
    return n;
}

struct archiver *archive_start(const struct cfg *cfg, struct eng *eng)
{
    g_cfg = cfg;
    if (!g_blob && !(g_blob = blob_open(cfg)))
        return NULL;
    free(g_providers);
    if (!(g_providers = malloc(PROVIDERS_MAX)))
        return NULL;
    (void)cfg_providers_literal(cfg, NULL, NULL, g_providers, PROVIDERS_MAX);
    struct archiver *A = calloc(1, sizeof(*A));
    if (!A || !(A->results = rq_new())) {
        free(A);
        return NULL;
    }
    A->cfg = cfg;
    A->eng = eng;
    if (cfg->archive_workers > 0)
        blob_sweep(g_blob);
    struct wpool_spec spec = {.name = "archive",
                              .claim_arg = claim_with_room,
                              .work = archive_one,
                              .idle_ms = IDLE_MS,
                              .error_ms = IDLE_MS,
                              .arg = A,
                              .chores = write_results,
                              .chores_fd = rq_fd(A->results),
                              .starved = arch_starved};
    eng_on_room(eng, arch_room, A);
    if (!(A->pool = wpool_start(cfg, cfg->archive_workers, &spec))) {
        eng_room_off(eng, A);
        rq_free(A->results);
        free(A);
        return NULL;
    }
    if (cfg->archive_workers > 0)
        atomic_store(&g_arch, A);
    return A;
}

void archive_quiesce(struct archiver *A)
{
    if (!A)
        return;
    atomic_store(&A->quiesced, 1);
    wpool_quiesce(A->pool);
}

void archive_stop(struct archiver *A)
{
    if (!A)
        return;
    /* Its threads write what is queued (born outputs given back: quiesced) before they stop. */
    wpool_stop(A->pool);
    atomic_store(&g_arch, NULL);
    eng_room_off(A->eng, A);
    rq_free(A->results);
    free(A);
}

int archive_job_outputs(struct db *db, long long tenant_id, const char *job_id, char **json,
                        int *settled)
{
    PGresult *r;
    *json = NULL;
    *settled = 0;
    int e =
        db_run(db, &job_outputs, DB_ARGS(p_int("tenant_id", tenant_id), p_text("id", job_id)), &r);
    if (e < 0)
        return e;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return STORE_ENOTFOUND;
    }
    *json = strdup(PQgetvalue(r, 0, 0));
    *settled = PQgetvalue(r, 0, 1)[0] == 't';
    PQclear(r);
    return *json ? STORE_OK : STORE_EINTERNAL;
}

int archive_output_get(struct db *db, long long tenant_id, const char *job_id, int n,
                       struct archive_output *out)
{
    PGresult *r;
    memset(out, 0, sizeof(*out));
    char nbuf[16];
    snprintf(nbuf, sizeof(nbuf), "%d", n);
    int e =
        db_run(db, &output_get,
               DB_ARGS(p_int("tenant_id", tenant_id), p_text("id", job_id), p_text("n", nbuf)), &r);
    if (e < 0)
        return e;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return STORE_ENOTFOUND;
    }
    out->res = r;
    out->planned = PQgetvalue(r, 0, 1)[0] == 't';
    out->exists = db_val(r, 0, 2) != NULL;
    out->state = db_val(r, 0, 3);
    out->sha256 = db_val(r, 0, 4);
    out->bytes = db_val(r, 0, 5) ? atoll(db_val(r, 0, 5)) : 0;
    out->content_type = db_val(r, 0, 6);
    out->last_error = db_val(r, 0, 7);
    out->backend = db_val(r, 0, 8);
    out->stored_by = db_val(r, 0, 9);
    return STORE_OK;
}

void archive_output_fini(struct archive_output *o)
{
    PQclear(o->res);
    memset(o, 0, sizeof(*o));
}

static const struct db_stmt *const statements[] = {
    &plan_pick, &plan_write, &claim, &claim_due, &finish, &finish_rows, &end_written,
    &job_outputs, &output_get,
};

const struct db_stmt *const *archive_statements(size_t *n)
{
    *n = sizeof(statements) / sizeof(statements[0]);
    return statements;
}
