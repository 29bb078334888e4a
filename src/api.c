#include "idemgate/api.h"

#include "idemgate/crash.h"
#include "idemgate/crypto.h"
#include "idemgate/fingerprint.h"
#include "idemgate/headers.h"
#include "idemgate/jcs.h"
#include "idemgate/jobview.h"
#include "idemgate/log.h"
#include "idemgate/migrate.h"
#include "idemgate/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROVIDERS_PREFIX "/v1/providers/"
#define JOBS_PREFIX "/v1/jobs/"
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

static void respond_job(struct http_req *r, int status, const struct store_job *j, int replayed,
                        int with_location)
{
    char *body = jobview_json(j);
    char loc[64];
    const char *hdrs[7] = {NULL};
    int h = 0;
    if (!body) {
        http_problem(r, 500, "internal", "Internal error", "out of memory", 0);
        return;
    }
    snprintf(loc, sizeof(loc), "/v1/jobs/%s", j->id);
    if (with_location) {
        hdrs[h++] = "Location";
        hdrs[h++] = loc;
    }
    if (replayed) {
        hdrs[h++] = "Idempotent-Replayed";
        hdrs[h++] = "true";
    }
    http_respond(r, status, "application/json", body, strlen(body), hdrs);
    free(body);
}

/* `Prefer: wait` on a terminal job: the provider's own status and body, with the job's
 * headers, as if the client had called the provider itself. */
static void respond_provider_result(struct http_req *r, const struct store_job *j, int replayed)
{
    if (!j->resp_status || !j->resp_body) {
        respond_job(r, 200, j, replayed, 1);
        return;
    }
    char ctype[128] = "application/json", loc[64], pref[32];
    (void)jobview_stored_header(j, "content-type", ctype, sizeof(ctype));
    snprintf(loc, sizeof(loc), "/v1/jobs/%s", j->id);
    snprintf(pref, sizeof(pref), "wait=%d", http_req_wait(r)->wait_seconds);
    const char *hdrs[] = {"Location",          loc,
                          "X-Idemgate-Job-Id", j->id,
                          "X-Idemgate-State",  st_name(j->state),
                          "Preference-Applied", pref,
                          replayed ? "Idempotent-Replayed" : NULL, "true",
                          NULL};
    http_respond(r, j->resp_status, ctype, (const char *)j->resp_body, j->resp_body_len, hdrs);
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
    snprintf(url, sizeof(url), "%s%s", p->base_url, rt->path);
    /* The canonical form is what is fingerprinted and what is sent: the provider receives
     * exactly the bytes the key is bound to. */
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
                                 .body = canon,
                                 .body_len = canon_len,
                                 .ttl_hours = cfg->job_ttl_hours};
    struct store_job j;
    int created = 0;
    CRASH_POINT("before_intent_commit");
    int e = store_intake(http_req_db(r), &q, &j, &created);
    free(canon);
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
    int wait_s = hdr_prefer_wait(http_req_header(r, "Prefer"), cfg->max_wait_seconds);
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
    struct store_job j;
    int e = store_job_get(http_req_db(r), token, id, &j);
    if (e == STORE_EAUTH)
        respond_unauthorized(r);
    else if (e == STORE_ENOTFOUND)
        http_problem(r, 404, "job-not-found", "Job not found", "no job with this id for this tenant",
                     0);
    else if (e < 0)
        respond_store_error(r, e);
    else {
        respond_job(r, 200, &j, 0, 0);
        store_job_fini(&j);
    }
}

static void handle_ready(struct http_req *r)
{
    int version = 0;
    int e = store_schema_version(http_req_db(r), &version);
    char body[160];
    int ready = e == STORE_OK && version == migrate_latest();
    int n = snprintf(body, sizeof(body),
                     "{\"ready\":%s,\"database\":%s,\"schema_version\":%d,\"schema_expected\":%d}",
                     ready ? "true" : "false", e == STORE_OK ? "true" : "false", version,
                     migrate_latest());
    http_respond(r, ready ? 200 : 503, "application/json", body, (size_t)n, NULL);
}

static int method_is(struct http_req *r, const char *m)
{
    return strcmp(http_req_method(r), m) == 0;
}

static void method_not_allowed(struct http_req *r, const char *allow)
{
    (void)allow;
    http_problem(r, 405, "method-not-allowed", "Method not allowed", allow, 0);
}

void api_handle(struct http_req *r)
{
    const char *path = http_req_path(r);
    if (http_req_wait(r)->active) {
        resume_wait(r);
        return;
    }
    if (strncmp(path, PROVIDERS_PREFIX, strlen(PROVIDERS_PREFIX)) == 0) {
        if (!method_is(r, "POST"))
            method_not_allowed(r, "POST");
        else
            handle_intake(r, path + strlen(PROVIDERS_PREFIX));
    } else if (strncmp(path, JOBS_PREFIX, strlen(JOBS_PREFIX)) == 0 &&
               !strchr(path + strlen(JOBS_PREFIX), '/')) {
        if (!method_is(r, "GET"))
            method_not_allowed(r, "GET");
        else
            handle_job_get(r, path + strlen(JOBS_PREFIX));
    } else if (strcmp(path, "/healthz") == 0) {
        http_respond(r, 200, "application/json", "{\"status\":\"ok\"}", 15, NULL);
    } else if (strcmp(path, "/readyz") == 0) {
        handle_ready(r);
    } else {
        http_problem(r, 404, "not-found", "Not found", "no such endpoint", 0);
    }
}
