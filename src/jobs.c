#include "idemgate/jobs.h"

#include "idemgate/api.h"
#include "idemgate/archive.h"
#include "idemgate/crypto.h"
#include "idemgate/fingerprint.h"
#include "idemgate/gate.h"
#include "idemgate/headers.h"
#include "idemgate/jobcache.h"
#include "idemgate/jobpage.h"
#include "idemgate/jobview.h"
#include "idemgate/log.h"
#include "idemgate/provider.h"
#include "idemgate/reply.h"
#include "idemgate/store.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The job id of the path and the caller's token hash: answers 404 (no possible id) or 401 (no
 * well-formed bearer token) and returns -1, or returns 0. */
static int job_caller(struct hs_req *r, const struct api_args *a, char id[CRYPTO_JOB_ID_LEN + 8],
                      char token[CRYPTO_SHA256_HEX])
{
    if (api_arg(a, 0, id, CRYPTO_JOB_ID_LEN + 8) <= 0) {
        reply_problem(r, 404, "job-not-found", "Job not found", "no job with this id", 0);
        return -1;
    }
    if (reply_token_hash(r, token) < 0) {
        reply_unauthorized(r);
        return -1;
    }
    return 0;
}

/* On a database worker: the job id of the path and the caller's tenant (404 or 401 when
 * either is missing). */
static int job_tenant(struct hs_req *r, const struct api_args *a, char id[CRYPTO_JOB_ID_LEN + 8],
                      char token[CRYPTO_SHA256_HEX], struct tenant *t)
{
    if (api_arg(a, 0, id, CRYPTO_JOB_ID_LEN + 8) <= 0) {
        reply_problem(r, 404, "job-not-found", "Job not found", "no job with this id", 0);
        return -1;
    }
    return reply_caller_tenant(r, token, t);
}

/* The database's answer to GET /v1/jobs/{id}, on a database worker. */
static void job_get_stored(struct hs_req *r, const struct api_args *a)
{
    char id[CRYPTO_JOB_ID_LEN + 8], token[CRYPTO_SHA256_HEX];
    struct tenant t;
    if (job_tenant(r, a, id, token, &t) < 0)
        return;
    struct store_job j;
    int e = store_job_get(api_db(r), t.id, id, &j);
    if (e == STORE_OK && j.state == ST_COMPLETED &&
        archive_job_outputs(api_db(r), j.tenant_id, j.id, &j.archive, &j.archive_settled) < 0)
        j.archive = NULL; /* the job is still answered, without its archive */
    if (e < 0)
        reply_job_error(r, e);
    else {
        reply_cache_terminal(token, &j);
        reply_job(r, 200, &j, 0, 0);
        store_job_fini(&j);
    }
}

void jobs_get(struct hs_req *r, const struct api_args *a)
{
    char id[CRYPTO_JOB_ID_LEN + 8], token[CRYPTO_SHA256_HEX];
    if (job_caller(r, a, id, token) < 0)
        return;
    /* A terminal job never changes: one of a tenant this replica knows live is answered from
     * memory. */
    struct tenant t;
    struct jobcache_entry hit;
    api_tenants_refresh(r);
    if (tenants_lookup(token, &t) > 0 && jobcache_get('j', token, id, &hit)) {
        reply_entry(r, 200, &hit, 0, 0);
        jobcache_entry_fini(&hit);
        return;
    }
    if (api_offload(r, job_get_stored, a) < 0)
        reply_shutting_down(r); /* the database workers have stopped */
}

struct list_ctx {
    cJSON *arr;
    int limit, n;
    size_t bytes; /* of the result bodies in the page */
    char cursor[JOBPAGE_CURSOR_LEN]; /* after the page's last job; "" when none */
    int has_more;
};

static void add_listed(const struct store_job *j, void *arg)
{
    struct list_ctx *l = arg;
    if (l->has_more || jobpage_past(l->n, l->limit, l->bytes)) { /* past the page: more */
        l->has_more = 1;
        return;
    }
    l->n++;
    l->bytes += j->resp_body_len;
    char *json = jobview_json(j);
    if (json) {
        cJSON_AddItemToArray(l->arr, cJSON_CreateRaw(json));
        free(json);
    }
    if (jobpage_cursor(j->created_at, j->id, l->cursor) < 0)
        l->cursor[0] = '\0';
}

/* A strict decimal integer in 1..1000, or -1. */
static int page_limit(const char *v)
{
    if (!v)
        return 100;
    char *end;
    long n = strtol(v, &end, 10);
    return *v >= '0' && *v <= '9' && !*end && n >= 1 && n <= 1000 ? (int)n : -1;
}

/* GET /v1/jobs?state=&provider=&idempotency_key=&limit=&starting_after=: the tenant's jobs,
 * newest first, a page at a time (jobpage.h). Any other parameter, or one given twice, is a 400
 * that names it: a filter misspelt is never silently ignored. */
void jobs_list(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    char token[CRYPTO_SHA256_HEX];
    struct tenant t;
    if (reply_caller_tenant(r, token, &t) < 0)
        return;
    int repeated;
    const char *bad = hs_req_query_check(r, jobpage_params, &repeated);
    if (bad) {
        char detail[256];
        snprintf(detail, sizeof(detail),
                 repeated ? "query parameter \"%.64s\" is given twice"
                          : "unknown query parameter \"%.64s\": GET /v1/jobs takes state, "
                            "provider, idempotency_key, limit and starting_after",
                 bad);
        reply_problem(r, 400, "invalid-query", "Invalid query", detail, 0);
        return;
    }
    struct store_jobs_query q = {
        .state = hs_req_query(r, "state"),
        .provider = hs_req_query(r, "provider"),
        .key = hs_req_query(r, "idempotency_key"),
        .limit = page_limit(hs_req_query(r, "limit")),
    };
    const char *after = hs_req_query(r, "starting_after");
    char stamp[28], id[65];
    const char *why = NULL;
    if (q.state && st_parse(q.state) < 0)
        why = "state must be a job state: prepared, sending, accepted, unknown, review, "
              "completed, failed or canceled";
    else if (q.limit < 0)
        why = "limit must be a whole number within 1..1000";
    else if (after && jobpage_cursor_parse(after, stamp, id) < 0)
        why = "starting_after must be the next_cursor of an earlier page";
    if (why) {
        reply_problem(r, 400, "invalid-query", "Invalid query", why, 0);
        return;
    }
    if (after) {
        q.before_at = stamp;
        q.before_id = id;
    }
    cJSON *o = cJSON_CreateObject();
    struct list_ctx l = {.arr = cJSON_AddArrayToObject(o, "data"), .limit = q.limit};
    cJSON_AddStringToObject(o, "object", "list");
    q.limit++; /* one row more than the page: whether another page follows */
    int e = store_jobs_list(api_db(r), t.id, &q, add_listed, &l);
    if (e < 0) {
        reply_store_error(r, e);
        cJSON_Delete(o);
        return;
    }
    cJSON_AddBoolToObject(o, "has_more", l.has_more);
    if (l.has_more && l.cursor[0])
        cJSON_AddStringToObject(o, "next_cursor", l.cursor);
    else
        cJSON_AddNullToObject(o, "next_cursor");
    reply_json(r, 200, o);
}

/* A tenant adopts a task only when the provider says it is this job's: the task, read by its id,
 * carries the job's client reference. Without that proof another tenant's task on the shared
 * provider account could be taken (the admin token may adopt any id). */
static int adoption_proven(const struct cfg_provider *p, const char *job_id, const char *remote)
{
    struct up_response res;
    if (!p->task_client_ref)
        return 0;
    int ok = prov_read_task(p, p->credential, remote, job_id, &res) == 0 &&
             prov_task_is(p, &res, job_id);
    up_response_fini(&res);
    return ok;
}

struct resolution {
    enum st_resolution what;
    const char *outcome, *remote, *op;
    int force;
};

/* Reads {"outcome", "remote_id", "operator", "force"}; 0, or -1 when malformed. */
static int parse_resolution(const cJSON *doc, struct resolution *res)
{
    res->outcome = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(doc, "outcome"));
    res->remote = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(doc, "remote_id"));
    res->op = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(doc, "operator"));
    const cJSON *force = cJSON_GetObjectItemCaseSensitive(doc, "force");
    if (force && !cJSON_IsBool(force))
        return -1;
    res->force = cJSON_IsTrue(force);
    int what = st_resolution_parse(res->outcome);
    if (what < 0 || (res->op && strlen(res->op) > 64))
        return -1;
    res->what = (enum st_resolution)what;
    if (res->what == RES_FOUND && (!res->remote || !*res->remote || strlen(res->remote) > 255))
        return -1;
    if (res->what != RES_FOUND)
        res->remote = NULL;
    return 0;
}

/* Answers the outcome of store_resolve. untouched: the write was refused and nobody resolved the
 * job since it was read in review (its resolved_at as read) — it changed under this decision
 * (left review, perhaps came back under another token): an earlier resolution on the row (never
 * cleared) is no replay of this one. */
static void respond_resolved(struct hs_req *r, int e, int applied, const struct store_job *j,
                             const struct resolution *res, int untouched)
{
    if (e < 0)
        reply_job_error(r, e);
    else if (!applied && untouched) {
        reply_problem(r, 409, "not-in-review", "Job changed",
                      "the job changed while this decision was made (it left review, perhaps to "
                      "come back, a task known now): read it again and decide",
                      0);
    } else if (applied) {
        LOG(LOG_INFO, "resolved", LS("job_id", j->id), LS("outcome", res->outcome),
            LS("state", st_name(j->state)), LS("request_id", hs_req_id(r)));
        reply_job(r, 200, j, 0, 0);
    } else if (j->resolution && strcmp(j->resolution, res->outcome) == 0 &&
               (!res->remote || (j->remote_id && strcmp(j->remote_id, res->remote) == 0))) {
        reply_job(r, 200, j, 1, 0); /* the same decision again: nothing changes */
    } else {
        reply_problem(r, 409, "not-in-review", "Job not in review",
                      j->resolution ? "the job was already resolved differently"
                                    : "only a job in state review can be resolved",
                      0);
    }
}

/* POST /v1/jobs/{id}/resolve: an operator's decision on a job in review, with the tenant's token
 * (a found task must then be proven this job's) or the admin token (any tenant's job). */
void jobs_resolve(struct hs_req *r, const struct api_args *a)
{
    char id[CRYPTO_JOB_ID_LEN + 8], token[CRYPTO_SHA256_HEX];
    size_t len = 0;
    if (job_caller(r, a, id, token) < 0)
        return;
    int admin = reply_is_admin(r);
    struct tenant t;
    if (!admin && reply_caller_tenant(r, token, &t) < 0)
        return;
    const char *body = hs_req_body(r, &len);
    cJSON *doc = cJSON_ParseWithLength(body, len);
    struct resolution res;
    struct store_job j;
    int applied = 0, e;
    if (parse_resolution(doc, &res) < 0) {
        reply_problem(r, 400, "invalid-resolution", "Invalid resolution",
                      "{\"outcome\":\"found\",\"remote_id\":…}, {\"outcome\":\"absent\"} or "
                      "{\"outcome\":\"abandon\"}; optional \"operator\" (up to 64 characters) "
                      "and \"force\" (a boolean)",
                      0);
        goto done;
    }
    /* The admin acts on any tenant's job: the job's tenant's rate applies (its token hash). */
    if (admin &&
        (e = store_admin_tenant_of(api_db(r), id, &t.id, t.name, sizeof(t.name), token)) < 0) {
        respond_resolved(r, e, 0, NULL, &res, 0);
        goto done;
    }
    if ((e = store_job_get(api_db(r), t.id, id, &j)) < 0) {
        respond_resolved(r, e, 0, NULL, &res, 0);
        goto done;
    }
    /* A resolution is written only for a job read in review, and answered from the job as read
     * otherwise (the same decision applied already: a replay; else 409). Read in another state,
     * a job may reach review before the write (a poll deadline, a reconciler's verdict) with
     * nothing of this decision checked against it: a tenant's `found` unproven (another
     * tenant's task adopted), an `absent` against a task id it got meanwhile. Read in review, its
     * remote id and webhook hint stay as read while its fencing token does (a cancel, a
     * verified webhook or a resume takes it out of review, and it may come back — a webhook's
     * rescue moves the token on): the write names the token read, and finds nothing else. */
    if (j.state != ST_REVIEW) {
        respond_resolved(r, STORE_OK, 0, &j, &res, 0);
        store_job_fini(&j);
        goto done;
    }
    long long version = j.lease_version; /* the decision is written only on the job as read */
    char resolved_at[48]; /* as read: a refused write after which it is the same was ours */
    snprintf(resolved_at, sizeof(resolved_at), "%s", j.resolved_at ? j.resolved_at : "");
    char hint[256], seen[48];
    if ((e = store_job_hint(api_db(r), t.id, id, hint, sizeof(hint), seen, sizeof(seen))) < 0) {
        store_job_fini(&j);
        respond_resolved(r, e, 0, NULL, &res, 0);
        goto done;
    }
    const struct cfg_provider *p = cfg_find_provider(api_cfg(r), j.provider, strlen(j.provider));
    if (res.what == RES_FOUND && !p) {
        /* What a found task becomes (polled for its outputs, read by id, or complete as it is)
         * is the provider's profile's to say: without it an async task was ended `completed`
         * with no outputs, never polled, its cancel never sent. */
        store_job_fini(&j);
        reply_problem(r, 409, "provider-not-configured", "Provider not configured here",
                      "this replica does not configure the job's provider: resolve it `found` "
                      "on a replica that does",
                      0);
        goto done;
    }
    int async = p && p->mode == CFG_MODE_ASYNC_POLL;
    enum op_state next =
        st_resolve_target(res.what, async, p && p->task_path, j.cancel_requested_at != NULL);
    int unproven = res.what == RES_FOUND && !admin && (!p || !adoption_proven(p, j.id, res.remote));
    /* An `absent` that sends the operation again is a creation at the provider: it passes the
     * tenant gate (gate.h) — the rate of the job's tenant, whoever resolves it; its budget is
     * the reservation and in-flight slot the operation has held since its intake. */
    struct gate_pass pass;
    int resend = next == ST_PREPARED && !j.cancel_requested_at;
    /* The task is known by the remote id on the row, by the id a verified webhook named for
     * this job and the reconciler could not read (kept on the row as its only proof), or by a
     * reconcile verdict that saw it without an id to adopt it by (its attempt row). */
    int has_id = (j.remote_id && *j.remote_id) || *hint;
    int known = (has_id || *seen) && st_resend_refused(res.what, next, 1, admin && res.force);
    if (known) {
        char detail[640];
        snprintf(detail, sizeof(detail),
                 "the provider's task for this job was seen (%s %s): `absent` would %s. "
                 "Resolve it `found` with %s, `abandon` it, or — with the admin token, when "
                 "that task is not this job's — send \"force\": true",
                 j.remote_id && *j.remote_id ? "remote_id"
                 : *hint                     ? "a verified webhook named"
                                             : st_seen_by(seen),
                 j.remote_id && *j.remote_id ? j.remote_id : *hint ? hint : seen,
                 next == ST_PREPARED ? "send it again and pay a second task"
                                     : "end it failed at no cost while its task exists",
                 has_id ? "that id" : "its id at the provider");
        store_job_fini(&j);
        reply_problem(r, 409, "task-known", "The job's task is known", detail, 0);
        goto done;
    }
    int retry_after = resend ? gate_admit(r, &(struct gate_req){.token_hash = token}, &pass) : 0;
    store_job_fini(&j);
    if (retry_after) {
        gate_reply_rate(r, retry_after);
        goto done;
    }
    if (unproven) {
        reply_problem(r, 403, "adoption-not-proven", "Adoption not proven",
                      "the provider's task does not carry this job's client reference (or cannot "
                      "be read by id): only the admin token may adopt it",
                      0);
        goto done;
    }
    char by[80];
    snprintf(by, sizeof(by), "admin%s%s", res.op ? ": " : "", res.op ? res.op : "");
    e = store_resolve(api_db(r), t.id, t.name, id, res.outcome, next, res.remote,
                      admin ? by : res.op, version, &j, &applied);
    respond_resolved(r, e, applied, &j, &res,
                     e == STORE_OK && !applied &&
                         strcmp(resolved_at, j.resolved_at ? j.resolved_at : "") == 0);
    if (e == STORE_OK)
        store_job_fini(&j);
done:
    cJSON_Delete(doc);
}

/* POST /v1/jobs/{id}/regenerate: a deliberate new paid creation, under its own key. */
void jobs_regenerate(struct hs_req *r, const struct api_args *a)
{
    const struct cfg *cfg = api_cfg(r);
    char parent_id[CRYPTO_JOB_ID_LEN + 8], token[CRYPTO_SHA256_HEX];
    char key[HDR_KEY_MAX + 1], fp[CRYPTO_SHA256_HEX], job_id[CRYPTO_JOB_ID_LEN];
    struct tenant t;
    if (job_tenant(r, a, parent_id, token, &t) < 0)
        return;
    size_t key_len = 0;
    const char *raw_key = hs_req_header_n(r, "Idempotency-Key", &key_len);
    if (!raw_key || hs_req_header_count(r, "Idempotency-Key") != 1 ||
        hdr_idempotency_key(raw_key, key_len, key) < 0) {
        reply_problem(r, 400, raw_key ? "invalid-idempotency-key" : "missing-idempotency-key",
                      "A regeneration needs its own Idempotency-Key",
                      "a regeneration is a new paid creation: give it a key of its own", 0);
        return;
    }
    /* A new paid creation: the tenant gate (gate.h). Its price is the parent's, which the store
     * reserves against the budget in the same commit. */
    struct gate_pass pass;
    int retry_after = gate_admit(r, &(struct gate_req){.token_hash = token}, &pass);
    if (retry_after) {
        gate_reply_rate(r, retry_after);
        return;
    }
    /* The operation a regeneration stands for is "one more from this parent". */
    fp_compute("(regenerate)", 12, parent_id, strlen(parent_id), "", 0, fp);
    if (crypto_job_id(job_id) < 0) {
        reply_problem(r, 500, "internal", "Internal error", "no randomness", 0);
        return;
    }
    struct store_job j;
    int created = 0;
    int e = store_regenerate(api_db(r), t.id, parent_id, job_id, key, fp, FP_VERSION,
                             cfg->job_ttl_hours, &j, &created);
    if (e == STORE_ECONFLICT) {
        reply_problem(r, 409, "parent-not-terminal", "Parent job not finished",
                      "only a completed, failed or canceled job can be regenerated", 0);
    } else if (e == STORE_EGONE) {
        /* The key's job was deleted by retention (its tombstone, j): never a second one. */
        if (strcmp(j.fingerprint_hex, fp) != 0) {
            reply_key_reused(r, 1, j.id, NULL);
        } else {
            char detail[300];
            snprintf(detail, sizeof(detail),
                     "this key's regeneration was job %s, which ended %s and was retired by "
                     "retention (deleted since); nothing was sent again",
                     j.id, st_name(j.state));
            reply_problem(r, 410, "idempotency-key-expired", "Idempotency key expired", detail,
                          0);
        }
        store_job_fini(&j);
    } else if (gate_refused(e)) {
        gate_reply_refused(r, e, -1, NULL); /* the parent's estimate, as the job shows it */
    } else if (e < 0) {
        reply_job_error(r, e);
    } else {
        if (!created && strcmp(j.fingerprint_hex, fp) != 0)
            reply_key_reused(r, 1, j.id, NULL);
        else {
            LOG(LOG_INFO, created ? "regenerate_new" : "regenerate_replay", LS("job_id", j.id),
                LS("parent_id", parent_id), LS("request_id", hs_req_id(r)));
            reply_job(r, 202, &j, !created, 1);
        }
        store_job_fini(&j);
    }
}

/* POST /v1/jobs/{id}/cancel: idempotent; the provider's cancel is sent at most once. */
void jobs_cancel(struct hs_req *r, const struct api_args *a)
{
    char id[CRYPTO_JOB_ID_LEN + 8], token[CRYPTO_SHA256_HEX];
    struct tenant t;
    if (job_tenant(r, a, id, token, &t) < 0)
        return;
    struct store_job j;
    int changed = 0;
    /* A running task its provider cannot stop: say so, and record nothing (a recorded cancel
     * would read as if the task were being stopped). */
    int e = store_job_get(api_db(r), t.id, id, &j);
    if (e < 0) {
        reply_job_error(r, e);
        return;
    }
    const struct cfg_provider *p = cfg_find_provider(api_cfg(r), j.provider, strlen(j.provider));
    int unstoppable = j.state == ST_ACCEPTED && !j.cancel_requested_at && p && !p->cancel_path;
    store_job_fini(&j);
    if (unstoppable) {
        reply_problem(r, 409, "cancel-unsupported", "Cancel not supported",
                      "this provider offers no way to stop a running task: it goes on, is paid, "
                      "and its result will be stored",
                      0);
        return;
    }
    e = store_cancel(api_db(r), t.id, id, &j, &changed);
    if (e < 0)
        reply_job_error(r, e);
    else {
        LOG(LOG_INFO, "cancel_requested", LS("job_id", j.id), LS("state", st_name(j.state)),
            LI("changed", changed), LS("request_id", hs_req_id(r)));
        reply_job(r, st_is_terminal(j.state) ? 200 : 202, &j, 0, 0);
        store_job_fini(&j);
    }
}
