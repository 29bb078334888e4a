#include "idemgate/reply.h"

#include "idemgate/sse.h"

#include "idemgate/pricing.h"

#include "idemgate/api.h"
#include "idemgate/crypto.h"
#include "idemgate/headers.h"
#include "idemgate/jobview.h"
#include "idemgate/problem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Seconds a client should wait before retrying when the database is unreachable. */
#define UNAVAILABLE_RETRY_AFTER 2

static int send_problem(struct hs_req *r, int status, const char *type, const char *title,
                        const char *detail, int retry_after, const char *const *extra);

int reply_problem(struct hs_req *r, int status, const char *type, const char *title,
                  const char *detail, int retry_after)
{
    return send_problem(r, status, type, title, detail, retry_after, NULL);
}

int reply_problem_with(struct hs_req *r, int status, const char *type, const char *title,
                       const char *detail, const char *const *extra)
{
    return send_problem(r, status, type, title, detail, 0, extra);
}

static int send_problem(struct hs_req *r, int status, const char *type, const char *title,
                        const char *detail, int retry_after, const char *const *extra)
{
    char body[PROBLEM_BODY_MAX], ra[16];
    const struct problem pb = {.status = status,
                               .type = type,
                               .title = title,
                               .detail = detail,
                               .request_id = hs_req_id(r)};
    size_t n = problem_render(&pb, body, sizeof(body));
    const char *hdrs[19] = {NULL};
    int h = 0;
    for (int i = 0; extra && extra[0] && i < 5; i++, extra += 2) {
        hdrs[h++] = extra[0];
        hdrs[h++] = extra[1];
    }
    if (retry_after > 0) {
        snprintf(ra, sizeof(ra), "%d", retry_after);
        hdrs[h++] = "Retry-After";
        hdrs[h++] = ra;
    }
    if (status == 401 && strcmp(type, "unauthorized") == 0) {
        hdrs[h++] = "WWW-Authenticate";
        hdrs[h++] = "Bearer realm=\"idemgate\"";
    }
    if (status == 405 && detail) {
        hdrs[h++] = "Allow";
        hdrs[h++] = detail; /* method_not_allowed passes the allowed method as the detail */
    }
    if ((status == 400 && (strcmp(type, "bad-request-framing") == 0 ||
                           strcmp(type, "bad-header") == 0)) ||
        (status == 503 && strcmp(type, "server-full") == 0) ||
        (status == 414 && strcmp(type, "uri-too-long") == 0)) {
        hdrs[h++] = "Connection";
        hdrs[h++] = "close";
    }
    return hs_respond(r, status, PROBLEM_CONTENT_TYPE, body, n, hdrs);
}

void reply_json(struct hs_req *r, int status, cJSON *o)
{
    char *body = o ? cJSON_PrintUnformatted(o) : NULL;
    if (body)
        hs_respond(r, status, "application/json", body, strlen(body), NULL);
    else
        reply_problem(r, 500, "internal", "Internal error", "out of memory", 0);
    free(body);
    cJSON_Delete(o);
}

void reply_shutting_down(struct hs_req *r)
{
    reply_problem(r, 503, "shutting-down", "Shutting down",
                  "this replica is draining and starts no new request; retry on another", 1);
}

void reply_store_error(struct hs_req *r, int e)
{
    if (e == STORE_EUNAVAIL)
        reply_problem(r, 503, "store-unavailable", "Storage unavailable",
                      "the database cannot be reached; the request may have been recorded "
                      "before it was lost (then it is sent): retry with the same "
                      "Idempotency-Key, never a new one",
                      UNAVAILABLE_RETRY_AFTER);
    else if (e == STORE_EGONE)
        reply_problem(r, 410, "idempotency-key-expired", "Idempotency key expired",
                      "this key's job ended and was deleted by retention; a new request needs a "
                      "new Idempotency-Key",
                      0);
    else if (e == STORE_ERETRY)
        reply_problem(r, 503, "store-busy", "Storage busy",
                      "the request kept conflicting with concurrent ones; retry with the same "
                      "Idempotency-Key",
                      1);
    else
        reply_problem(r, 500, "internal", "Internal error", "see the gateway's log", 0);
}

/* Seconds a client at its in-flight limit is asked to wait: a job of its own has to end first. */
#define INFLIGHT_RETRY_AFTER 2

void reply_budget_refused(struct hs_req *r, int e, long long estimate_micros,
                          const char *currency)
{
    char detail[200], amount[32];
    if (e == STORE_EINFLIGHT) {
        reply_problem(r, 429, "too-many-in-flight", "Too many jobs in flight",
                      "the tenant has as many jobs in flight as its budget allows; retry with the "
                      "same Idempotency-Key once one has ended",
                      INFLIGHT_RETRY_AFTER);
        return;
    }
    if (estimate_micros >= 0)
        snprintf(detail, sizeof(detail),
                 "the estimated cost of %s %s would pass the tenant's %s budget; nothing was "
                 "recorded or sent",
                 price_format(estimate_micros, amount, sizeof(amount)), currency ? currency : "",
                 e == STORE_EOVERDAY ? "daily" : "monthly");
    else
        snprintf(detail, sizeof(detail),
                 "the estimated cost would pass the tenant's %s budget; nothing was recorded or "
                 "sent",
                 e == STORE_EOVERDAY ? "daily" : "monthly");
    reply_problem(r, 402, "budget-exceeded", "Budget exceeded", detail, 0);
}

void reply_unauthorized(struct hs_req *r)
{
    reply_problem(r, 401, "unauthorized", "Unauthorized",
                  "a valid `Authorization: Bearer <tenant token>` is required", 0);
}

/* A store error on a tenant's job: 401, 404 (also another tenant's job) or 503/500. */
void reply_job_error(struct hs_req *r, int e)
{
    if (e == STORE_EAUTH)
        reply_unauthorized(r);
    else if (e == STORE_ENOTFOUND)
        reply_problem(r, 404, "job-not-found", "Job not found",
                      "no job with this id for this tenant", 0);
    else
        reply_store_error(r, e);
}

/* The SHA-256 of the bearer token, the only form in which tokens are ever compared or stored.
 * Returns 0, or -1 when there is no well-formed bearer token. */
int reply_token_hash(struct hs_req *r, char out[CRYPTO_SHA256_HEX])
{
    size_t len = 0;
    const char *t = hdr_bearer(hs_req_header(r, "Authorization"), &len);
    if (!t || hs_req_header_count(r, "Authorization") != 1)
        return -1;
    crypto_sha256_hex(t, len, out);
    return 0;
}

int reply_caller_tenant(struct hs_req *r, char token[CRYPTO_SHA256_HEX], struct tenant *t)
{
    if (reply_token_hash(r, token) < 0) {
        reply_unauthorized(r);
        return -1;
    }
    int e = tenants_get(api_db(r), token, t);
    if (e == STORE_EAUTH)
        reply_unauthorized(r);
    else if (e < 0)
        reply_store_error(r, e);
    return e < 0 ? -1 : 0;
}

/* The answer-shaped view of a job: what a response or the cache needs. job_json is owned;
 * resp_body is borrowed from the job (release with entry_release, not jobcache_entry_fini). */
static int entry_of(const struct store_job *j, struct jobcache_entry *e)
{
    memset(e, 0, sizeof(*e));
    e->job_json = jobview_json(j);
    if (!e->job_json)
        return -1;
    snprintf(e->fingerprint, sizeof(e->fingerprint), "%s",
             j->fingerprint_hex ? j->fingerprint_hex : "");
    snprintf(e->job_id, sizeof(e->job_id), "%s", j->id);
    snprintf(e->provider, sizeof(e->provider), "%s", j->provider ? j->provider : "");
    snprintf(e->route, sizeof(e->route), "%s", j->route ? j->route : "");
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

void reply_entry(struct hs_req *r, int status, const struct jobcache_entry *e, int replayed,
                 int with_location)
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
    hs_respond(r, status, "application/json", e->job_json, strlen(e->job_json), hdrs);
}

void reply_job(struct hs_req *r, int status, const struct store_job *j, int replayed,
               int with_location)
{
    struct jobcache_entry e;
    if (entry_of(j, &e) < 0) {
        reply_problem(r, 500, "internal", "Internal error", "out of memory", 0);
        return;
    }
    reply_entry(r, status, &e, replayed, with_location);
    entry_release(&e);
}

/* `Prefer: wait` on a terminal job: the provider's own status and body, with the job's
 * headers, as if the client had called the provider itself. */
/* The record converted for a client that asked for the other delivery (reply_result): into
 * *out (a shallow copy of e with its own body, to free), 1; or 0 when e is served as stored. */
static int converted(const struct jobcache_entry *e, const struct reply_delivery *dv,
                     struct jobcache_entry *out)
{
    if (!dv || !dv->format || e->resp_status < 200 || e->resp_status >= 300 ||
        strcmp(e->state, "completed") != 0)
        return 0;
    int recorded_stream = strncasecmp(e->content_type, "text/event-stream", 17) == 0;
    if (recorded_stream == dv->stream)
        return 0;
    size_t n = 0;
    char *body = recorded_stream
                     ? sse_assemble((enum sse_format)dv->format, e->resp_body, e->resp_body_len, &n)
                     : sse_synthesize((enum sse_format)dv->format, e->resp_body, e->resp_body_len,
                                      &n);
    if (!body)
        return 0;
    *out = *e;
    out->resp_body = body;
    out->resp_body_len = n;
    snprintf(out->content_type, sizeof(out->content_type), "%s",
             recorded_stream ? "application/json" : "text/event-stream");
    return 1;
}

/* A terminal job without the provider's answer to serve (never answered, cancelled before it
 * was sent, or ended by a task read): completed, the job itself (200); failed, a 502 and
 * canceled, a 409 problem with the job's headers — never a 200 a client would take for the
 * provider's success. */
static void reply_unanswered(struct hs_req *r, const struct jobcache_entry *e, int replayed,
                             const char *const *hdrs)
{
    if (strcmp(e->state, "completed") == 0) {
        reply_entry(r, 200, e, replayed, 1);
        return;
    }
    int canceled = strcmp(e->state, "canceled") == 0;
    cJSON *doc = cJSON_Parse(e->job_json);
    const char *why = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(doc, "last_error"));
    char detail[512];
    snprintf(detail, sizeof(detail), "job %s ended %s%s%s (see the job for what is known)",
             e->job_id, e->state, why ? ": " : "", why ? why : "");
    reply_problem_with(r, canceled ? 409 : 502, canceled ? "job-canceled" : "job-failed",
                       canceled ? "Job canceled" : "Job failed", detail, hdrs);
    cJSON_Delete(doc);
}

void reply_result(struct hs_req *r, const struct jobcache_entry *e, int replayed, int wait_s,
                  const struct reply_delivery *dv)
{
    struct jobcache_entry other;
    if (converted(e, dv, &other)) {
        reply_result(r, &other, replayed, wait_s, NULL);
        free(other.resp_body);
        return;
    }
    char loc[64], pref[32];
    snprintf(loc, sizeof(loc), "/v1/jobs/%s", e->job_id);
    snprintf(pref, sizeof(pref), "wait=%d", wait_s);
    const char *hdrs[] = {"Location",
                          loc,
                          "X-Idemgate-Job-Id",
                          e->job_id,
                          "X-Idemgate-State",
                          e->state,
                          "Preference-Applied",
                          pref,
                          replayed ? "Idempotent-Replayed" : NULL,
                          "true",
                          NULL};
    /* Failed or canceled with a 2xx kept (a task read whose status said so): never served as a
     * success either. Completed with no success kept (an operator's `found` over an attempt's
     * 502, the result not read): the job, never that refusal as the job's answer. */
    int ended_badly = strcmp(e->state, "failed") == 0 || strcmp(e->state, "canceled") == 0;
    int ok2xx = e->resp_status >= 200 && e->resp_status < 300;
    if (!e->resp_status || !e->resp_body || (ended_badly && ok2xx) ||
        (!ended_badly && !ok2xx && strcmp(e->state, "completed") == 0)) {
        reply_unanswered(r, e, replayed, hdrs);
        return;
    }
    hs_respond(r, e->resp_status, e->content_type, e->resp_body, e->resp_body_len, hdrs);
}

void reply_provider_result(struct hs_req *r, const struct store_job *j, int replayed, int wait_s,
                           const struct reply_delivery *dv)
{
    struct jobcache_entry e;
    if (entry_of(j, &e) < 0) {
        reply_problem(r, 500, "internal", "Internal error", "out of memory", 0);
        return;
    }
    reply_result(r, &e, replayed, wait_s, dv);
    entry_release(&e);
}

/* How long a completed job's view whose archive is still changing answers reads by id. */
#define ARCHIVE_VIEW_MS 250

/* Remembers a terminal job for later replays (by key) and reads (by id) of this tenant. */
void reply_cache_terminal(const char *token, const struct store_job *j)
{
    struct jobcache_entry e;
    if (!st_is_terminal(j->state) || entry_of(j, &e) < 0)
        return;
    /* A replay shows the same archive: never older than a read by id already showed it. */
    int unsettled = j->state == ST_COMPLETED && j->archive && !j->archive_settled;
    jobcache_put('k', token, j->idempotency_key, &e, unsettled ? ARCHIVE_VIEW_MS : 0);
    /* GET /v1/jobs/{id} shows a completed job's archive, which changes after the job ended
     * (planned, then each output copied): a view whose archive is not settled yet answers reads
     * by id from memory for ARCHIVE_VIEW_MS only, so that a client watching the copy sees it
     * progress while a client polling the job still reads memory. */
    if (j->state != ST_COMPLETED || (j->archive && j->archive_settled))
        jobcache_put('j', token, j->id, &e, 0);
    else if (j->archive)
        jobcache_put('j', token, j->id, &e, ARCHIVE_VIEW_MS);
    entry_release(&e);
}

/* Answers a job after a decision (new or replay): at once, or after waiting for it. */

/* 1 when the request carries the admin token (its SHA-256 is configured). Answers nothing. */
int reply_is_admin(struct hs_req *r)
{
    const struct cfg *cfg = api_cfg(r);
    char token[CRYPTO_SHA256_HEX];
    return *cfg->admin_token_sha256 && reply_token_hash(r, token) == 0 &&
           strlen(cfg->admin_token_sha256) == 64 &&
           crypto_ct_equal(token, cfg->admin_token_sha256, 64);
}

/* The one text of the 422 a reused key gets: whose the key is and what differed. */
void reply_key_reused(struct hs_req *r, int regeneration, const char *job_id, const char *part)
{
    char detail[256];
    if (regeneration)
        snprintf(detail, sizeof(detail),
                 "this key already belongs to job %.40s, made by another request; use a new key "
                 "for a new regeneration",
                 job_id ? job_id : "?");
    else if (part)
        snprintf(detail, sizeof(detail),
                 "this key already belongs to job %.40s, whose request had another %s; use a new "
                 "key for a new intended output",
                 job_id ? job_id : "?", part);
    else
        snprintf(detail, sizeof(detail),
                 "this key already belongs to job %.40s, whose request had another provider, "
                 "route or body; use a new key for a new intended output",
                 job_id ? job_id : "?");
    reply_problem(r, 422, "idempotency-key-reused",
                  "Idempotency-Key reused with different parameters", detail, 0);
}
