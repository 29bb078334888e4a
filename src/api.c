#include "idemgate/api.h"

#include "idemgate/attempt.h"
#include "idemgate/crash.h"
#include "idemgate/crypto.h"
#include "idemgate/fingerprint.h"
#include "idemgate/headers.h"
#include "idemgate/inject.h"
#include "idemgate/jcs.h"
#include "idemgate/jobcache.h"
#include "idemgate/jobview.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/migrate.h"
#include "idemgate/provider.h"
#include "idemgate/store.h"
#include "idemgate/whverify.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROVIDERS_PREFIX "/v1/providers/"
#define JOBS_PREFIX "/v1/jobs/"
#define ADMIN_PROVIDERS "/v1/admin/providers/"
#define WEBHOOKS_PREFIX "/v1/webhooks/"
#define ADMIN_JOBS "/v1/admin/jobs/"
/* Seconds a client should wait before retrying when the database is unreachable. */
#define UNAVAILABLE_RETRY_AFTER 2

static void respond_store_error(struct http_req *r, int e)
{
    if (e == STORE_EUNAVAIL)
        http_problem(r, 503, "store-unavailable", "Storage unavailable",
                     "the database cannot be reached; retry with the same Idempotency-Key",
                     UNAVAILABLE_RETRY_AFTER);
    else if (e == STORE_ERETRY)
        http_problem(r, 503, "store-busy", "Storage busy",
                     "the request kept conflicting with concurrent ones; retry with the same "
                     "Idempotency-Key",
                     1);
    else
        http_problem(r, 500, "internal", "Internal error", "see the gateway's log", 0);
}

static void respond_unauthorized(struct http_req *r)
{
    http_problem(r, 401, "unauthorized", "Unauthorized",
                 "a valid `Authorization: Bearer <tenant token>` is required", 0);
}

/* A store error on a tenant's job: 401, 404 (also another tenant's job) or 503/500. */
static void respond_job_error(struct http_req *r, int e)
{
    if (e == STORE_EAUTH)
        respond_unauthorized(r);
    else if (e == STORE_ENOTFOUND)
        http_problem(r, 404, "job-not-found", "Job not found", "no job with this id for this tenant",
                     0);
    else
        respond_store_error(r, e);
}

/* The SHA-256 of the bearer token, the only form in which tokens are ever compared or stored.
 * Returns 0, or -1 when there is no well-formed bearer token. */
static int token_hash(struct http_req *r, char out[CRYPTO_SHA256_HEX])
{
    size_t len = 0;
    const char *t = hdr_bearer(http_req_header(r, "Authorization"), &len);
    if (!t || http_req_header_count(r, "Authorization") != 1)
        return -1;
    crypto_sha256_hex(t, len, out);
    return 0;
}

/* Before a 4xx that needs no database, make sure the caller is a tenant: an unauthenticated
 * client learns nothing about routes or validation. Returns 1 when it answered 401 or 503. */
static int reject_if_unauthenticated(struct http_req *r, const char *token)
{
    struct store_job j;
    int e = store_job_get(http_req_db(r), token, "", &j);
    if (e == STORE_OK)
        store_job_fini(&j);
    if (e == STORE_EAUTH) {
        respond_unauthorized(r);
        return 1;
    }
    if (e == STORE_EUNAVAIL || e == STORE_EINTERNAL) {
        respond_store_error(r, e);
        return 1;
    }
    return 0;
}

/* The answer-shaped view of a job: what a response or the cache needs. job_json is owned;
 * resp_body is borrowed from the job (release with entry_release, not jobcache_entry_fini). */
static int entry_of(const struct store_job *j, struct jobcache_entry *e)
{
    memset(e, 0, sizeof(*e));
    e->job_json = jobview_json(j);
    if (!e->job_json)
        return -1;
    snprintf(e->fingerprint, sizeof(e->fingerprint), "%s", j->fingerprint_hex ? j->fingerprint_hex : "");
    snprintf(e->job_id, sizeof(e->job_id), "%s", j->id);
    snprintf(e->state, sizeof(e->state), "%s", st_name(j->state));
    e->resp_status = j->resp_status;
    snprintf(e->content_type, sizeof(e->content_type), "application/json");
    (void)jobview_stored_header(j, "content-type", e->content_type, sizeof(e->content_type));
    e->resp_body = (char *)j->resp_body;
    e->resp_body_len = j->resp_body_len;
    return 0;
}

static void entry_release(struct jobcache_entry *e)
{
    free(e->job_json);
    e->job_json = NULL;
}

static void respond_entry(struct http_req *r, int status, const struct jobcache_entry *e,
                          int replayed, int with_location)
{
    char loc[64];
    const char *hdrs[7] = {NULL};
    int h = 0;
    snprintf(loc, sizeof(loc), "/v1/jobs/%s", e->job_id);
    if (with_location) {
        hdrs[h++] = "Location";
        hdrs[h++] = loc;
    }
    if (replayed) {
        hdrs[h++] = "Idempotent-Replayed";
        hdrs[h++] = "true";
    }
    http_respond(r, status, "application/json", e->job_json, strlen(e->job_json), hdrs);
}

static void respond_job(struct http_req *r, int status, const struct store_job *j, int replayed,
                        int with_location)
{
    struct jobcache_entry e;
    if (entry_of(j, &e) < 0) {
        http_problem(r, 500, "internal", "Internal error", "out of memory", 0);
        return;
    }
    respond_entry(r, status, &e, replayed, with_location);
    entry_release(&e);
}

/* `Prefer: wait` on a terminal job: the provider's own status and body, with the job's
 * headers, as if the client had called the provider itself. */
static void respond_result(struct http_req *r, const struct jobcache_entry *e, int replayed)
{
    if (!e->resp_status || !e->resp_body) {
        respond_entry(r, 200, e, replayed, 1);
        return;
    }
    char loc[64], pref[32];
    snprintf(loc, sizeof(loc), "/v1/jobs/%s", e->job_id);
    snprintf(pref, sizeof(pref), "wait=%d", http_req_wait(r)->wait_seconds);
    const char *hdrs[] = {"Location",          loc,
                          "X-Idemgate-Job-Id", e->job_id,
                          "X-Idemgate-State",  e->state,
                          "Preference-Applied", pref,
                          replayed ? "Idempotent-Replayed" : NULL, "true",
                          NULL};
    http_respond(r, e->resp_status, e->content_type, e->resp_body, e->resp_body_len, hdrs);
}

static void respond_provider_result(struct http_req *r, const struct store_job *j, int replayed)
{
    struct jobcache_entry e;
    if (entry_of(j, &e) < 0) {
        http_problem(r, 500, "internal", "Internal error", "out of memory", 0);
        return;
    }
    respond_result(r, &e, replayed);
    entry_release(&e);
}

/* Remembers a terminal job for later replays (by key) and reads (by id) of this tenant. */
static void cache_terminal(const char *token, const struct store_job *j)
{
    struct jobcache_entry e;
    if (!st_is_terminal(j->state) || entry_of(j, &e) < 0)
        return;
    jobcache_put('k', token, j->idempotency_key, &e);
    jobcache_put('j', token, j->id, &e);
    entry_release(&e);
}

/* Answers a job after a decision (new or replay): at once, or after waiting for it. */
static void answer_or_wait(struct http_req *r, struct store_job *j, int replayed, int wait_s,
                           const char *token)
{
    if (wait_s > 0 && st_is_terminal(j->state)) {
        http_req_wait(r)->wait_seconds = wait_s;
        respond_provider_result(r, j, replayed);
        return;
    }
    if (wait_s > 0) {
        struct http_wait *w = http_req_wait(r);
        snprintf(w->job_id, sizeof(w->job_id), "%s", j->id);
        snprintf(w->token_hash, sizeof(w->token_hash), "%s", token);
        w->replayed = replayed;
        w->wait_seconds = wait_s;
        /* Suspend before registering, so that a wake-up can never precede the suspension. */
        http_suspend(r);
        if (waiters_add(http_req_waiters(r), j->id, waiters_now() + wait_s, http_resume, r) == 0)
            return;
        http_resume(r); /* cannot wait: answer on resumption with the current state */
        return;
    }
    respond_job(r, 202, j, replayed, 1);
}

/* The second call of a suspended request: read the job again and answer. */
static void resume_wait(struct http_req *r)
{
    struct http_wait *w = http_req_wait(r);
    struct store_job j;
    int e = store_job_get(http_req_db(r), w->token_hash, w->job_id, &j);
    if (e == STORE_OK) {
        if (st_is_terminal(j.state))
            respond_provider_result(r, &j, w->replayed);
        else
            respond_job(r, 202, &j, w->replayed, 1);
        store_job_fini(&j);
    } else if (e == STORE_ENOTFOUND || e == STORE_EAUTH) {
        /* The tenant was revoked or the job expired while the client waited. */
        respond_unauthorized(r);
    } else {
        respond_store_error(r, e);
    }
}

/* How many outputs the request asks for, when the provider's outputs are counted: the number at
 * the profile's path in the body, or its default. -1 when outputs are not counted. */
static int outputs_requested(const struct cfg_provider *p, const char *canon, size_t len)
{
    if (!p->outputs_received)
        return -1;
    int n = p->outputs_default;
    if (p->outputs_requested) {
        cJSON *doc = cJSON_ParseWithLength(canon, len);
        const cJSON *v = jpath_first(p->outputs_requested, doc);
        if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1000)
            n = (int)v->valuedouble;
        cJSON_Delete(doc);
    }
    return n;
}

static void handle_intake(struct http_req *r, const char *rest)
{
    const struct cfg *cfg = http_req_cfg(r);
    char token[CRYPTO_SHA256_HEX], key[HDR_KEY_MAX + 1], fp[CRYPTO_SHA256_HEX];
    char job_id[CRYPTO_JOB_ID_LEN], url[2048], detail[160];
    struct jcs_error jerr;
    char *canon = NULL;
    size_t canon_len = 0, body_len = 0;

    if (token_hash(r, token) < 0) {
        respond_unauthorized(r);
        return;
    }
    if (http_req_body_too_large(r)) {
        snprintf(detail, sizeof(detail), "the body exceeds %ld bytes", cfg->max_body_bytes);
        http_problem(r, 413, "payload-too-large", "Payload too large", detail, 0);
        return;
    }
    const char *slash = strchr(rest, '/');
    const struct cfg_provider *p = slash ? cfg_find_provider(cfg, rest, (size_t)(slash - rest)) : NULL;
    const struct cfg_route *rt = p ? cfg_find_route(p, slash + 1, strlen(slash + 1)) : NULL;
    if (!rt) {
        if (!reject_if_unauthenticated(r, token))
            http_problem(r, 404, "unknown-route", "Unknown provider route",
                         "only routes declared in the gateway's configuration are forwarded", 0);
        return;
    }
    const char *raw_key = http_req_header(r, "Idempotency-Key");
    if (!raw_key) {
        if (!reject_if_unauthenticated(r, token))
            http_problem(r, 400, "missing-idempotency-key", "Missing Idempotency-Key",
                         "send an Idempotency-Key header that identifies the intended output", 0);
        return;
    }
    if (http_req_header_count(r, "Idempotency-Key") != 1 || hdr_idempotency_key(raw_key, key) < 0) {
        if (!reject_if_unauthenticated(r, token))
            http_problem(r, 400, "invalid-idempotency-key", "Invalid Idempotency-Key",
                         "one key of 1 to 255 printable ASCII characters, bare or as an RFC 8941 "
                         "quoted string",
                         0);
        return;
    }
    const char *body = http_req_body(r, &body_len);
    int je = jcs_canonicalize(body, body_len, cfg->max_json_depth, &canon, &canon_len, &jerr);
    if (je < 0) {
        if (je == JCS_ENOMEM) {
            http_problem(r, 500, "internal", "Internal error", "out of memory", 0);
        } else if (!reject_if_unauthenticated(r, token)) {
            snprintf(detail, sizeof(detail), "%s at byte %zu", jerr.what, jerr.offset);
            http_problem(r, 400, "invalid-json", "Invalid JSON body", detail, 0);
        }
        return;
    }
    fp_compute(p->name, strlen(p->name), rt->route, strlen(rt->route), canon, canon_len, fp);
    if (crypto_job_id(job_id) < 0 || !fp[0]) {
        free(canon);
        http_problem(r, 500, "internal", "Internal error", "no randomness", 0);
        return;
    }
    /* A terminal job never changes: a replay of it needs no database round trip. */
    int wait_s = hdr_prefer_wait(http_req_header(r, "Prefer"), cfg->max_wait_seconds);
    struct jobcache_entry hit;
    if (jobcache_get('k', token, key, &hit)) {
        free(canon);
        if (strcmp(hit.fingerprint, fp) != 0) {
            http_problem(r, 422, "idempotency-key-reused",
                         "Idempotency-Key reused with different parameters",
                         "this key already belongs to a request with another provider, route or "
                         "body; use a new key for a new intended output",
                         0);
        } else if (wait_s > 0) {
            http_req_wait(r)->wait_seconds = wait_s;
            respond_result(r, &hit, 1);
        } else {
            respond_entry(r, 202, &hit, 1, 1);
        }
        jobcache_entry_fini(&hit);
        return;
    }
    snprintf(url, sizeof(url), "%s%s", p->base_url, rt->path);
    int requested = outputs_requested(p, canon, canon_len);
    /* The canonical form is what is fingerprinted; the client's own bytes, compacted, are
     * what is stored and sent, so numbers beyond 2^53 reach the provider exactly as written. */
    char *sent = NULL;
    size_t sent_len = 0;
    if (inject_compact(body, body_len, &sent, &sent_len) < 0) {
        free(canon);
        http_problem(r, 500, "internal", "Internal error", "out of memory", 0);
        return;
    }
    /* A create whose reconciliation finds the task by our client reference never leaves
     * without it: when the body leaves no place for it, the client learns it now. */
    if (p->client_ref_body_field && attempt_needs_client_ref(prof_reconcile_name(p->reconcile)) &&
        inject_check(sent, sent_len, p->client_ref_body_field) != INJECT_OK) {
        free(canon);
        free(sent);
        if (!reject_if_unauthenticated(r, token)) {
            snprintf(detail, sizeof(detail),
                     "this provider needs the gateway's reference at \"%s\" in a JSON object "
                     "body; remove that member or send an object there",
                     p->client_ref_body_field);
            http_problem(r, 422, "client-ref-unplaceable", "Client reference cannot be placed",
                         detail, 0);
        }
        return;
    }
    struct store_intake_req q = {.token_sha256_hex = token,
                                 .idempotency_key = key,
                                 .new_id = job_id,
                                 .fingerprint_hex = fp,
                                 .fingerprint_version = FP_VERSION,
                                 .provider = p->name,
                                 .route = rt->route,
                                 .method = rt->method,
                                 .url = url,
                                 .credential = p->secret_env ? p->secret_env : "",
                                 .body = sent,
                                 .body_len = sent_len,
                                 .ttl_hours = cfg->job_ttl_hours,
                                 .idem_header = p->idem_header,
                                 .reconcile_strategy = prof_reconcile_name(p->reconcile),
                                 .outputs_requested = requested,
                                 .profile_id = p->profile_id};
    struct store_job j;
    int created = 0;
    CRASH_POINT("before_intent_commit");
    int e = store_intake(http_req_db(r), &q, &j, &created);
    free(canon);
    free(sent);
    if (e == STORE_EAUTH) {
        respond_unauthorized(r);
        return;
    }
    if (e < 0) {
        respond_store_error(r, e);
        return;
    }
    CRASH_POINT("after_intent_commit");
    char key_hash[CRYPTO_SHA256_HEX];
    crypto_sha256_hex(key, strlen(key), key_hash);
    key_hash[16] = '\0'; /* a prefix identifies the key in logs without revealing it */
    if (!created && strcmp(j.fingerprint_hex, fp) != 0) {
        LOG(LOG_INFO, "intake_mismatch", LS("job_id", j.id), LS("key_hash", key_hash),
            LS("provider", p->name), LS("request_id", http_req_id(r)));
        http_problem(r, 422, "idempotency-key-reused",
                     "Idempotency-Key reused with different parameters",
                     "this key already belongs to a request with another provider, route or "
                     "body; use a new key for a new intended output",
                     0);
        store_job_fini(&j);
        return;
    }
    LOG(LOG_INFO, created ? "intake_new" : "intake_replay", LS("job_id", j.id),
        LS("key_hash", key_hash), LS("provider", p->name), LS("state", st_name(j.state)),
        LS("request_id", http_req_id(r)));
    cache_terminal(token, &j);
    answer_or_wait(r, &j, !created, wait_s, token);
    store_job_fini(&j);
}

static void handle_job_get(struct http_req *r, const char *id)
{
    char token[CRYPTO_SHA256_HEX];
    if (token_hash(r, token) < 0) {
        respond_unauthorized(r);
        return;
    }
    struct jobcache_entry hit;
    if (jobcache_get('j', token, id, &hit)) {
        respond_entry(r, 200, &hit, 0, 0);
        jobcache_entry_fini(&hit);
        return;
    }
    struct store_job j;
    int e = store_job_get(http_req_db(r), token, id, &j);
    if (e < 0)
        respond_job_error(r, e);
    else {
        cache_terminal(token, &j);
        respond_job(r, 200, &j, 0, 0);
        store_job_fini(&j);
    }
}

static void add_breaker(const char *provider, int status, const char *reason,
                        const char *tripped_at, void *arg)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "provider", provider);
    cJSON_AddBoolToObject(b, "tripped", 1);
    cJSON_AddNumberToObject(b, "http_status", status);
    cJSON_AddStringToObject(b, "reason", reason);
    cJSON_AddStringToObject(b, "tripped_at", tripped_at);
    cJSON_AddItemToArray(arg, b);
}

/* Ready: the database answers and the schema is the one this binary expects. A tripped provider
 * credential is reported but does not make the replica unready: the other providers work. */
static void handle_ready(struct http_req *r)
{
    int version = 0;
    int e = store_schema_version(http_req_db(r), &version);
    /* A newer schema is fine: migrations are additive, so a replica of the previous release
     * stays ready while a rollout migrates ahead of it. */
    int ready = e == STORE_OK && version >= migrate_latest();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "ready", ready);
    cJSON_AddBoolToObject(o, "database", e == STORE_OK);
    cJSON_AddNumberToObject(o, "schema_version", version);
    cJSON_AddNumberToObject(o, "schema_expected", migrate_latest());
    cJSON *tripped = cJSON_AddArrayToObject(o, "tripped_providers");
    if (ready)
        ready = store_breaker_list(http_req_db(r), add_breaker, tripped) == STORE_OK;
    char *body = cJSON_PrintUnformatted(o);
    if (body)
        http_respond(r, ready ? 200 : 503, "application/json", body, strlen(body), NULL);
    free(body);
    cJSON_Delete(o);
}

struct list_ctx {
    cJSON *arr;
};

static void add_listed(const struct store_job *j, void *arg)
{
    struct list_ctx *l = arg;
    char *json = jobview_json(j);
    if (json) {
        cJSON_AddItemToArray(l->arr, cJSON_CreateRaw(json));
        free(json);
    }
}

/* GET /v1/jobs?state=S&limit=N: the tenant's jobs, oldest first. */
static void handle_job_list(struct http_req *r)
{
    char token[CRYPTO_SHA256_HEX];
    if (token_hash(r, token) < 0) {
        respond_unauthorized(r);
        return;
    }
    const char *state = http_req_query(r, "state");
    const char *lim = http_req_query(r, "limit");
    int limit = lim ? atoi(lim) : 100;
    if ((state && st_parse(state) < 0) || limit < 1 || limit > 1000) {
        if (!reject_if_unauthenticated(r, token))
            http_problem(r, 400, "invalid-query", "Invalid query",
                         "state must be a job state and limit within 1..1000", 0);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    struct list_ctx l = {cJSON_AddArrayToObject(o, "data")};
    cJSON_AddStringToObject(o, "object", "list");
    int e = store_jobs_list(http_req_db(r), token, state, limit, add_listed, &l);
    if (e == STORE_OK && cJSON_GetArraySize(l.arr) == 0 && reject_if_unauthenticated(r, token)) {
        cJSON_Delete(o);
        return;
    }
    if (e < 0) {
        respond_store_error(r, e);
    } else {
        char *body = cJSON_PrintUnformatted(o);
        if (body)
            http_respond(r, 200, "application/json", body, strlen(body), NULL);
        free(body);
    }
    cJSON_Delete(o);
}

/* 1 when the request carries the admin token (its SHA-256 is configured). Answers nothing. */
static int is_admin(struct http_req *r)
{
    const struct cfg *cfg = http_req_cfg(r);
    char token[CRYPTO_SHA256_HEX];
    return *cfg->admin_token_sha256 && token_hash(r, token) == 0 &&
           strlen(cfg->admin_token_sha256) == 64 &&
           crypto_ct_equal(token, cfg->admin_token_sha256, 64);
}

static const char *task_var(const char *name, size_t len, void *arg)
{
    return len == 2 && memcmp(name, "id", 2) == 0 ? arg : NULL;
}

/* A tenant adopts a task only when the provider says it is this job's: the task, read by its id,
 * carries the job's client reference. Without that proof another tenant's task on the shared
 * provider account could be taken (the admin token may adopt any id). */
static int adoption_proven(const struct cfg_provider *p, const char *job_id, const char *remote)
{
    const char *tmpl = p->task_path ? p->task_path
                       : p->mode == CFG_MODE_ASYNC_POLL ? p->poll_path
                                                        : NULL;
    if (!tmpl || !p->task_client_ref)
        return 0;
    char *url = prov_url(p, tmpl, task_var, (void *)remote, "task");
    struct up_response res;
    memset(&res, 0, sizeof(res));
    struct prov_call call = {.method = "GET", .url = url, .credential = p->secret_env};
    int ok = url && prov_call(p, &call, &res) == 0 && res.http_status >= 200 &&
             res.http_status < 300 && !res.body_truncated;
    cJSON *doc = ok ? cJSON_ParseWithLength(res.body, res.body_len) : NULL;
    const char *ref = doc ? jpath_string(p->task_client_ref, doc) : NULL;
    ok = ref && strcmp(ref, job_id) == 0;
    cJSON_Delete(doc);
    up_response_fini(&res);
    free(url);
    return ok;
}

struct resolution {
    enum st_resolution what;
    const char *outcome, *remote, *op;
};

/* Reads {"outcome", "remote_id", "operator"}; 0, or -1 when malformed. */
static int parse_resolution(const cJSON *doc, struct resolution *res)
{
    res->outcome = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(doc, "outcome"));
    res->remote = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(doc, "remote_id"));
    res->op = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(doc, "operator"));
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

/* Answers the outcome of store_resolve. */
static void respond_resolved(struct http_req *r, int e, int applied, const struct store_job *j,
                             const struct resolution *res)
{
    if (e < 0)
        respond_job_error(r, e);
    else if (applied) {
        LOG(LOG_INFO, "resolved", LS("job_id", j->id), LS("outcome", res->outcome),
            LS("state", st_name(j->state)), LS("request_id", http_req_id(r)));
        respond_job(r, 200, j, 0, 0);
    } else if (j->resolution && strcmp(j->resolution, res->outcome) == 0 &&
               (!res->remote || (j->remote_id && strcmp(j->remote_id, res->remote) == 0))) {
        respond_job(r, 200, j, 1, 0); /* the same decision again: nothing changes */
    } else {
        http_problem(r, 409, "not-in-review", "Job not in review",
                     j->resolution ? "the job was already resolved differently"
                                   : "only a job in state review can be resolved",
                     0);
    }
}

/* POST /v1/jobs/{id}/resolve: an operator's decision on a job in review, with the tenant's token
 * (a found task must then be proven this job's) or the admin token (any tenant's job). */
static void handle_resolve(struct http_req *r, const char *id)
{
    char token[CRYPTO_SHA256_HEX];
    size_t len = 0;
    int admin = is_admin(r);
    if (token_hash(r, token) < 0) {
        respond_unauthorized(r);
        return;
    }
    const char *body = http_req_body(r, &len);
    cJSON *doc = cJSON_ParseWithLength(body, len);
    struct resolution res;
    struct store_job j;
    int applied = 0, e;
    if (parse_resolution(doc, &res) < 0) {
        if (admin || !reject_if_unauthenticated(r, token))
            http_problem(r, 400, "invalid-resolution", "Invalid resolution",
                         "{\"outcome\":\"found\",\"remote_id\":…}, {\"outcome\":\"absent\"} or "
                         "{\"outcome\":\"abandon\"}; optional \"operator\" (up to 64 characters)",
                         0);
        goto done;
    }
    if (admin && (e = store_admin_token_of(http_req_db(r), id, token)) < 0) {
        respond_resolved(r, e, 0, NULL, &res);
        goto done;
    }
    if ((e = store_job_get(http_req_db(r), token, id, &j)) < 0) {
        respond_resolved(r, e, 0, NULL, &res);
        goto done;
    }
    const struct cfg_provider *p = cfg_find_provider(http_req_cfg(r), j.provider,
                                                     strlen(j.provider));
    int async = p && p->mode == CFG_MODE_ASYNC_POLL;
    enum op_state next = st_resolve_target(res.what, async, p && p->task_path,
                                           j.cancel_requested_at != NULL);
    int unproven = res.what == RES_FOUND && !admin && j.state == ST_REVIEW &&
                   (!p || !adoption_proven(p, j.id, res.remote));
    store_job_fini(&j);
    if (unproven) {
        http_problem(r, 403, "adoption-not-proven", "Adoption not proven",
                     "the provider's task does not carry this job's client reference (or cannot "
                     "be read by id): only the admin token may adopt it",
                     0);
        goto done;
    }
    char by[80];
    snprintf(by, sizeof(by), "admin%s%s", res.op ? ": " : "", res.op ? res.op : "");
    e = store_resolve(http_req_db(r), token, id, res.outcome, next, res.remote,
                      admin ? by : res.op, &j, &applied);
    respond_resolved(r, e, applied, &j, &res);
    if (e == STORE_OK)
        store_job_fini(&j);
done:
    cJSON_Delete(doc);
}

/* POST /v1/jobs/{id}/regenerate: a deliberate new paid creation, under its own key. */
static void handle_regenerate(struct http_req *r, const char *parent_id)
{
    const struct cfg *cfg = http_req_cfg(r);
    char token[CRYPTO_SHA256_HEX], key[HDR_KEY_MAX + 1], fp[CRYPTO_SHA256_HEX];
    char job_id[CRYPTO_JOB_ID_LEN];
    if (token_hash(r, token) < 0) {
        respond_unauthorized(r);
        return;
    }
    const char *raw_key = http_req_header(r, "Idempotency-Key");
    if (!raw_key || http_req_header_count(r, "Idempotency-Key") != 1 ||
        hdr_idempotency_key(raw_key, key) < 0) {
        if (!reject_if_unauthenticated(r, token))
            http_problem(r, 400, raw_key ? "invalid-idempotency-key" : "missing-idempotency-key",
                         "A regeneration needs its own Idempotency-Key",
                         "a regeneration is a new paid creation: give it a key of its own", 0);
        return;
    }
    /* The operation a regeneration stands for is "one more from this parent". */
    fp_compute("(regenerate)", 12, parent_id, strlen(parent_id), "", 0, fp);
    if (crypto_job_id(job_id) < 0) {
        http_problem(r, 500, "internal", "Internal error", "no randomness", 0);
        return;
    }
    struct store_job j;
    int created = 0;
    int e = store_regenerate(http_req_db(r), token, parent_id, job_id, key, fp, FP_VERSION,
                             cfg->job_ttl_hours, &j, &created);
    if (e == STORE_ECONFLICT) {
        http_problem(r, 409, "parent-not-terminal", "Parent job not finished",
                     "only a completed or failed job can be regenerated", 0);
    } else if (e < 0) {
        respond_job_error(r, e);
    } else {
        if (!created && strcmp(j.fingerprint_hex, fp) != 0)
            http_problem(r, 422, "idempotency-key-reused",
                         "Idempotency-Key reused with different parameters",
                         "this key already belongs to another request", 0);
        else {
            LOG(LOG_INFO, created ? "regenerate_new" : "regenerate_replay", LS("job_id", j.id),
                LS("parent_id", parent_id), LS("request_id", http_req_id(r)));
            respond_job(r, 202, &j, !created, 1);
        }
        store_job_fini(&j);
    }
}

/* The admin token; answers 401 and returns 0 when absent. */
static int admin_ok(struct http_req *r)
{
    if (!is_admin(r)) {
        http_problem(r, 401, "unauthorized", "Unauthorized", "the admin token is required", 0);
        return 0;
    }
    return 1;
}

/* POST /v1/admin/jobs/{id}/resume: polling of an accepted job whose poll deadline passed starts
 * again, for one more deadline of its provider. */
static void handle_admin_resume(struct http_req *r, const char *job_id)
{
    if (!admin_ok(r))
        return;
    int e = store_resume_polling(http_req_db(r), job_id, 3600L * 1000);
    if (e == STORE_ENOTFOUND)
        http_problem(r, 404, "job-not-found", "Job not found", "no accepted job with this id", 0);
    else if (e < 0)
        respond_store_error(r, e);
    else
        http_respond(r, 200, "application/json", "{\"resumed\":true}", 16, NULL);
}

/* POST /v1/admin/providers/{p}/reset: clears a tripped provider credential. */
static void handle_admin_reset(struct http_req *r, const char *provider)
{
    const struct cfg *cfg = http_req_cfg(r);
    if (!admin_ok(r))
        return;
    if (!cfg_find_provider(cfg, provider, strlen(provider))) {
        http_problem(r, 404, "unknown-provider", "Unknown provider", provider, 0);
        return;
    }
    int cleared = 0;
    int e = store_breaker_reset(http_req_db(r), provider, &cleared);
    if (e < 0) {
        respond_store_error(r, e);
        return;
    }
    LOG(LOG_WARN, "provider_reset", LS("provider", provider), LI("cleared", cleared),
        LS("request_id", http_req_id(r)));
    char body[192];
    int n = snprintf(body, sizeof(body), "{\"provider\":\"%s\",\"cleared\":%s}", provider,
                     cleared ? "true" : "false");
    http_respond(r, 200, "application/json", body, (size_t)n, NULL);
}

static const char *req_header(const char *name, void *arg)
{
    return http_req_header(arg, name);
}

/* POST /v1/webhooks/{provider}: verify, dedupe by event id, then treat as a hint — the poller
 * re-reads the task's status through the adapter and applies a forward-only transition. The
 * webhook's own body never changes a job. */
static void handle_webhook(struct http_req *r, const char *provider)
{
    const struct cfg *cfg = http_req_cfg(r);
    const struct cfg_provider *p = cfg_find_provider(cfg, provider, strlen(provider));
    size_t len = 0;
    if (!p || !p->webhook_task_id) {
        http_problem(r, 404, "unknown-provider", "Unknown provider",
                     "no webhooks are configured for this provider", 0);
        return;
    }
    const char *body = http_req_body(r, &len);
    const char *secret = p->webhook_secret_env ? getenv(p->webhook_secret_env) : NULL;
    long long now = (long long)time(NULL);
    int ok = -1;
    if (!strcmp(p->webhook_verify, "standard_webhooks"))
        ok = wh_verify_standard(req_header, r, body, len, secret, now);
    else if (!strcmp(p->webhook_verify, "hmac_sha256_hex"))
        ok = wh_verify_hmac_hex(req_header, r, p->webhook_signature_header, body, len, secret);
    else if (!strcmp(p->webhook_verify, "ed25519"))
        ok = wh_verify_ed25519(req_header, r, body, len, secret, now);
    else if (!strcmp(p->webhook_verify, "none"))
        ok = 0;
    if (ok < 0) {
        metrics_safety(MS_WEBHOOK_REFUSED);
        LOG(LOG_WARN, "webhook_refused", LS("provider", provider), LS("request_id", http_req_id(r)));
        http_problem(r, 401, "bad-signature", "Webhook signature refused",
                     "the signature, secret or timestamp does not verify", 0);
        return;
    }
    /* Ids are read exactly: a numeric task id above 2^53 is its digits, never a rounded
     * double. Our client reference counts only when the delivery is signed. */
    int is_signed = strcmp(p->webhook_verify, "none") != 0;
    cJSON *doc = prov_id_doc(body, len);
    const char *tid = doc ? prov_read_id(p->webhook_task_id, doc) : NULL;
    const char *ref = doc && is_signed && p->webhook_client_ref
                          ? prov_read_id(p->webhook_client_ref, doc)
                          : NULL;
    char task[256] = "", event[256] = "", client_ref[256] = "";
    if (tid)
        snprintf(task, sizeof(task), "%s", tid);
    if (ref)
        snprintf(client_ref, sizeof(client_ref), "%s", ref);
    const char *eid = p->webhook_event_id_header ? http_req_header(r, p->webhook_event_id_header)
                      : p->webhook_event_id && doc ? jpath_string(p->webhook_event_id, doc)
                                                   : NULL;
    if (eid)
        snprintf(event, sizeof(event), "%s", eid);
    else /* no event id from the provider: the delivery's own content identifies it */
        crypto_sha256_hex(body, len, event);
    cJSON_Delete(doc);
    if (!*task) {
        http_problem(r, 400, "invalid-webhook", "Webhook without a task id",
                     "the body has no task id where the profile says", 0);
        return;
    }
    int fresh = 0, hinted = 0, parked = 0;
    CRASH_POINT("webhook_before_dedupe");
    struct store_webhook_req wr = {.provider = p->name,
                                   .event_id = event,
                                   .remote_id = task,
                                   .window_hours = p->webhook_window_hours,
                                   .is_signed = is_signed,
                                   .client_ref = *client_ref ? client_ref : NULL};
    int e = store_webhook(http_req_db(r), &wr, &fresh, &hinted, &parked);
    CRASH_POINT("webhook_after_dedupe");
    if (e < 0) {
        respond_store_error(r, e); /* the provider redelivers */
        return;
    }
    if (!fresh)
        metrics_safety(MS_WEBHOOK_DUPLICATE);
    LOG(LOG_INFO, "webhook", LS("provider", p->name), LS("remote_id", task),
        LI("duplicate", !fresh), LI("hinted", hinted), LI("parked", parked));
    char out[128];
    int n = snprintf(out, sizeof(out), "{\"received\":true,\"duplicate\":%s,\"parked\":%s}",
                     fresh ? "false" : "true", parked ? "true" : "false");
    http_respond(r, 200, "application/json", out, (size_t)n, NULL);
}

/* POST /v1/jobs/{id}/cancel: idempotent; the provider's cancel is sent at most once. */
static void handle_cancel(struct http_req *r, const char *id)
{
    char token[CRYPTO_SHA256_HEX];
    if (token_hash(r, token) < 0) {
        respond_unauthorized(r);
        return;
    }
    struct store_job j;
    int changed = 0;
    int e = store_cancel(http_req_db(r), token, id, &j, &changed);
    if (e < 0)
        respond_job_error(r, e);
    else {
        LOG(LOG_INFO, "cancel_requested", LS("job_id", j.id), LS("state", st_name(j.state)),
            LI("changed", changed), LS("request_id", http_req_id(r)));
        respond_job(r, st_is_terminal(j.state) ? 200 : 202, &j, 0, 0);
        store_job_fini(&j);
    }
}

struct gauge_text {
    char buf[4096];
    size_t len;
    int state_header, tripped_header;
};

static void add_gauge(const char *kind, const char *name, long long value, void *arg)
{
    struct gauge_text *g = arg;
    size_t cap = sizeof(g->buf) - g->len;
    int n = 0;
    if (!strcmp(kind, "state")) {
        if (!g->state_header++)
            n += snprintf(g->buf + g->len, cap,
                          "# HELP idemgate_operations Operations by state.\n"
                          "# TYPE idemgate_operations gauge\n");
        n += snprintf(g->buf + g->len + n, cap - (size_t)n, "idemgate_operations{state=\"%s\"} %lld\n",
                      name, value);
        if (!strcmp(name, "review"))
            n += snprintf(g->buf + g->len + n, cap - (size_t)n,
                          "# HELP idemgate_review_backlog Operations waiting for an operator.\n"
                          "# TYPE idemgate_review_backlog gauge\nidemgate_review_backlog %lld\n",
                          value);
    } else {
        n += snprintf(g->buf + g->len, cap, "idemgate_provider_tripped{provider=\"%s\"} 1\n", name);
    }
    if (n > 0 && (size_t)n < cap)
        g->len += (size_t)n;
}

/* GET /metrics: process counters, and gauges read from the database (bounded labels only:
 * states and configured provider names). */
static void handle_metrics(struct http_req *r)
{
    struct gauge_text g = {.len = 0};
    const struct cfg *cfg = http_req_cfg(r);
    g.buf[0] = '\0';
    int e = store_gauges(http_req_db(r), add_gauge, &g);
    size_t cap = sizeof(g.buf) - g.len;
    int n = snprintf(g.buf + g.len, cap,
                     "# HELP idemgate_provider_tripped A provider whose credential is refused.\n"
                     "# TYPE idemgate_provider_tripped gauge\n"
                     "# HELP idemgate_database_up The database answered this scrape.\n"
                     "# TYPE idemgate_database_up gauge\nidemgate_database_up %d\n"
                     "# HELP idemgate_providers_configured Providers in the configuration.\n"
                     "# TYPE idemgate_providers_configured gauge\n"
                     "idemgate_providers_configured %zu\n",
                     e == STORE_OK, cfg->n_providers);
    if (n > 0 && (size_t)n < cap)
        g.len += (size_t)n;
    char *text = metrics_render(g.buf);
    if (!text) {
        http_problem(r, 500, "internal", "Internal error", "out of memory", 0);
        return;
    }
    http_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text), NULL);
    free(text);
}

static int method_is(struct http_req *r, const char *m)
{
    return strcmp(http_req_method(r), m) == 0;
}

static void method_not_allowed(struct http_req *r, const char *allow)
{
    http_problem(r, 405, "method-not-allowed", "Method not allowed", allow, 0);
}

/* /v1/jobs/{id} and /v1/jobs/{id}/{action}. */
static void handle_job_path(struct http_req *r, const char *rest)
{
    char id[CRYPTO_JOB_ID_LEN + 8];
    const char *slash = strchr(rest, '/');
    size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
    if (n == 0 || n >= sizeof(id)) {
        http_problem(r, 404, "job-not-found", "Job not found", "no job with this id", 0);
        return;
    }
    memcpy(id, rest, n);
    id[n] = '\0';
    if (!slash) {
        http_req_set_route(r, MR_JOB_GET);
        if (!method_is(r, "GET"))
            method_not_allowed(r, "GET");
        else
            handle_job_get(r, id);
    } else if (strcmp(slash, "/resolve") == 0 || strcmp(slash, "/regenerate") == 0 ||
               strcmp(slash, "/cancel") == 0) {
        if (!method_is(r, "POST"))
            method_not_allowed(r, "POST");
        else if (strcmp(slash, "/resolve") == 0)
            http_req_set_route(r, MR_RESOLVE), handle_resolve(r, id);
        else if (strcmp(slash, "/cancel") == 0)
            http_req_set_route(r, MR_CANCEL), handle_cancel(r, id);
        else
            http_req_set_route(r, MR_REGENERATE), handle_regenerate(r, id);
    } else {
        http_problem(r, 404, "not-found", "Not found", "no such endpoint", 0);
    }
}

void api_handle(struct http_req *r)
{
    const char *path = http_req_path(r);
    if (http_req_wait(r)->active) {
        resume_wait(r);
        return;
    }
    if (strncmp(path, PROVIDERS_PREFIX, strlen(PROVIDERS_PREFIX)) == 0) {
        http_req_set_route(r, MR_INTAKE);
        if (!method_is(r, "POST"))
            method_not_allowed(r, "POST");
        else
            handle_intake(r, path + strlen(PROVIDERS_PREFIX));
    } else if (strcmp(path, "/v1/jobs") == 0) {
        http_req_set_route(r, MR_JOB_LIST);
        if (!method_is(r, "GET"))
            method_not_allowed(r, "GET");
        else
            handle_job_list(r);
    } else if (strncmp(path, JOBS_PREFIX, strlen(JOBS_PREFIX)) == 0) {
        handle_job_path(r, path + strlen(JOBS_PREFIX));
    } else if (strncmp(path, ADMIN_PROVIDERS, strlen(ADMIN_PROVIDERS)) == 0) {
        http_req_set_route(r, MR_ADMIN);
        const char *p = path + strlen(ADMIN_PROVIDERS);
        const char *slash = strchr(p, '/');
        char name[64];
        if (!slash || strcmp(slash, "/reset") != 0 || (size_t)(slash - p) >= sizeof(name)) {
            http_problem(r, 404, "not-found", "Not found", "no such endpoint", 0);
        } else if (!method_is(r, "POST")) {
            method_not_allowed(r, "POST");
        } else {
            memcpy(name, p, (size_t)(slash - p));
            name[slash - p] = '\0';
            handle_admin_reset(r, name);
        }
    } else if (strncmp(path, ADMIN_JOBS, strlen(ADMIN_JOBS)) == 0) {
        http_req_set_route(r, MR_ADMIN);
        const char *p = path + strlen(ADMIN_JOBS);
        const char *slash = strchr(p, '/');
        char id[64];
        if (!slash || strcmp(slash, "/resume") != 0 || (size_t)(slash - p) >= sizeof(id)) {
            http_problem(r, 404, "not-found", "Not found", "no such endpoint", 0);
        } else if (!method_is(r, "POST")) {
            method_not_allowed(r, "POST");
        } else {
            memcpy(id, p, (size_t)(slash - p));
            id[slash - p] = '\0';
            handle_admin_resume(r, id);
        }
    } else if (strncmp(path, WEBHOOKS_PREFIX, strlen(WEBHOOKS_PREFIX)) == 0) {
        http_req_set_route(r, MR_WEBHOOK);
        if (!method_is(r, "POST"))
            method_not_allowed(r, "POST");
        else
            handle_webhook(r, path + strlen(WEBHOOKS_PREFIX));
    } else if (strcmp(path, "/metrics") == 0) {
        http_req_set_route(r, MR_METRICS);
        handle_metrics(r);
    } else if (strcmp(path, "/healthz") == 0) {
        http_req_set_route(r, MR_HEALTH);
        http_respond(r, 200, "application/json", "{\"status\":\"ok\"}", 15, NULL);
    } else if (strcmp(path, "/readyz") == 0) {
        http_req_set_route(r, MR_READY);
        handle_ready(r);
    } else {
        http_problem(r, 404, "not-found", "Not found", "no such endpoint", 0);
    }
}
