#include "idemgate/attempt.h"

#include "idemgate/backoff.h"
#include "idemgate/classify.h"
#include "idemgate/crash.h"
#include "idemgate/crypto.h"
#include "idemgate/inject.h"
#include "idemgate/log.h"
#include "idemgate/policy.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RESPONSE_BYTES (16u * 1024 * 1024)
/* Margin kept between the last moment a worker may start sending and its lease's end, for
 * clock rate differences and the time the request takes to leave. */
#define LEASE_SEND_MARGIN_S 1.0
/* How long an operation that could not be sent here waits before any replica tries again. */
#define NOT_SENT_RETRY_MS 5000

double attempt_mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double attempt_wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double attempt_rand01(void)
{
    uint64_t r = 0;
    if (crypto_random(&r, sizeof(r)) < 0)
        return 0.5;
    return (double)(r >> 11) / 9007199254740992.0; /* 53 random bits */
}

/* Refuses to send once the lease is (nearly) over, by this host's monotonic clock, which keeps
 * counting while the process is stopped: a worker frozen past its lease wakes up, finds its
 * deadline gone, and sends nothing, because another replica may own the operation by now. */
static int lease_guard(void *arg)
{
    const double *deadline = arg;
    return attempt_mono_now() > *deadline ? -1 : 0;
}

/* Writes a result that needs no call: the operation was claimed but cannot be sent here. */
static void release_unsent(struct db *db, const struct store_claim *c, const char *why)
{
    struct store_finish f = {.tenant_id = c->tenant_id,
                             .id = c->id,
                             .lease_version = c->lease_version,
                             .from = ST_SENDING,
                             .kind = "create",
                             .state = ST_PREPARED,
                             .outcome = cls_name(CLS_NOT_SENT),
                             .error = why,
                             .retry_delay_ms = NOT_SENT_RETRY_MS,
                             .outputs_received = -1,
                             .outputs_requested = -1,
                             .started_at = attempt_wall_now(),
                             .finished_at = attempt_wall_now()};
    int applied = 0;
    LOG(LOG_ERROR, "dispatch_not_sent", LS("job_id", c->id), LS("provider", c->provider),
        LS("error", why));
    if (store_finish(db, &f, &applied) < 0)
        LOG(LOG_WARN, "dispatch_result_lost", LS("job_id", c->id),
            LS("note", "the reaper will mark it unknown"));
}

/* The server's wish for a delay, in any of its forms: retry-after-ms, Retry-After (seconds or
 * HTTP-date), or the provider's words in the body. -1 when it expressed none. */
static long long server_hint_ms(const struct cfg_provider *p, const struct up_response *res)
{
    long long hint = -1;
    cJSON *h = res->headers_json ? cJSON_Parse(res->headers_json) : NULL;
    const char *ms = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(h, "retry-after-ms"));
    const char *ra = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(h, "retry-after"));
    if (ms)
        hint = bo_retry_after_ms_header(ms);
    if (hint < 0 && ra)
        hint = bo_retry_after_ms(ra, (long long)time(NULL));
    cJSON_Delete(h);
    if (hint < 0 && p->body_hint.ok && res->body)
        hint = bo_body_hint_ms(&p->body_hint, res->body, res->body_len);
    return hint;
}

struct results {
    int received;  /* -1: not counted */
    char *usage;   /* JSON text or NULL */
};

static void count_results(const struct cfg_provider *p, const struct up_response *res,
                          struct results *out)
{
    out->received = -1;
    out->usage = NULL;
    if (!res->body || (!p->outputs_received && !p->usage))
        return;
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(res->body, res->body_len, &end, 0);
    if (!doc)
        return;
    if (p->outputs_received)
        out->received = (int)jpath_each(p->outputs_received, doc, NULL, NULL);
    const cJSON *u = p->usage ? jpath_first(p->usage, doc) : NULL;
    if (u && cJSON_IsObject(u))
        out->usage = cJSON_PrintUnformatted(u);
    cJSON_Delete(doc);
}

void attempt_create(const struct cfg *cfg, struct db *db, const struct store_claim *c,
                    double claimed_mono)
{
    const struct cfg_provider *p = cfg_find_provider(cfg, c->provider, strlen(c->provider));
    char auth[1024];
    const char *secret = NULL;
    if (!p) {
        release_unsent(db, c, "provider is not configured on this replica");
        return;
    }
    if (*c->credential) {
        secret = getenv(c->credential);
        if (!secret || !*secret) {
            release_unsent(db, c, "the provider's credential variable is not set");
            return;
        }
        snprintf(auth, sizeof(auth), "%s%s", p->auth_prefix ? p->auth_prefix : "", secret);
    }
    /* The client reference and the provider idempotency key are derived from the operation,
     * never from the client's own key, and are the same on every transport retry. */
    const char *hdrs[9] = {"X-Idemgate-Operation", c->id};
    int h = 2;
    if (c->idem_header) {
        hdrs[h++] = c->idem_header;
        hdrs[h++] = c->id;
    }
    if (p->client_ref_header) {
        hdrs[h++] = p->client_ref_header;
        hdrs[h++] = c->id;
    }
    char *body = NULL;
    size_t body_len = 0;
    if (p->client_ref_body_field &&
        inject_member((const char *)c->body, c->body_len, p->client_ref_body_field, c->id, &body,
                      &body_len) < 0) {
        LOG(LOG_WARN, "client_ref_not_injected", LS("job_id", c->id),
            LS("field", p->client_ref_body_field));
        body = NULL;
    }
    double deadline = claimed_mono + c->lease_remaining_s - LEASE_SEND_MARGIN_S;
    struct up_request req = {.method = c->method,
                             .url = c->url,
                             .auth_header = secret ? p->auth_header : NULL,
                             .auth_value = secret ? auth : NULL,
                             .headers = hdrs,
                             .body = body ? body : (const char *)c->body,
                             .body_len = body ? body_len : c->body_len,
                             .connect_timeout_ms = p->connect_timeout_ms,
                             .total_timeout_ms = p->total_timeout_ms,
                             .max_response_bytes = MAX_RESPONSE_BYTES,
                             .before_send = lease_guard,
                             .before_send_arg = &deadline};
    struct up_response res;
    double t0 = attempt_wall_now();
    up_call(&req, &res);
    double t1 = attempt_wall_now();
    explicit_bzero(auth, sizeof(auth));
    free(body);
    CRASH_POINT("after_response");

    struct results rs;
    count_results(p, &res, &rs);
    int requested = c->outputs_requested;
    struct cls_evidence ev = {.curl_code = res.curl_code,
                              .bytes_sent = res.bytes_sent,
                              .header_bytes = res.header_bytes,
                              .http_status = res.http_status,
                              .outputs_short = requested > 0 && rs.received >= 0 &&
                                               rs.received < requested,
                              .idempotent = c->idem_header != NULL};
    enum cls_outcome outcome = res.aborted_before_send ? CLS_NOT_SENT : cls_classify(&ev);
    long long hint = server_hint_ms(p, &res);
    struct pol_input in = {.outcome = outcome,
                           .attempts_made = c->transport_attempts,
                           .max_attempts = p->max_attempts,
                           .elapsed_ms = c->since_first_ms + (long long)((t1 - t0) * 1000),
                           .deadline_ms = p->deadline_ms,
                           .hint_ms = hint,
                           .base_ms = p->backoff_base_ms,
                           .cap_ms = p->backoff_cap_ms,
                           .rand01 = attempt_rand01()};
    struct pol_decision d = pol_decide(&in);
    char why[400];
    const char *error = d.reason;
    if (res.aborted_before_send) {
        error = "lease expired before sending";
    } else if (res.body_truncated && d.next == ST_COMPLETED) {
        snprintf(why, sizeof(why), "response larger than %u bytes", MAX_RESPONSE_BYTES);
        d.next = ST_UNKNOWN;
        error = why;
    } else if (d.next != ST_COMPLETED) {
        if (res.curl_code)
            snprintf(why, sizeof(why), "%s: %s", d.reason, res.error);
        else
            snprintf(why, sizeof(why), "%s: HTTP %d", d.reason, res.http_status);
        error = why;
    } else {
        error = outcome == CLS_PARTIAL ? "partial result: fewer outputs than requested" : NULL;
    }
    if (d.next == ST_UNKNOWN) {
        /* The first look comes after the reconcile interval; with no way to look, at the end
         * of the recovery window. */
        long long wait = p->reconcile == RECON_NONE ? p->recovery_window_ms - in.elapsed_ms
                                                    : p->reconcile_interval_ms;
        d.delay_ms = wait > 0 ? wait : 0;
    }
    struct store_finish f = {.tenant_id = c->tenant_id,
                             .id = c->id,
                             .lease_version = c->lease_version,
                             .from = ST_SENDING,
                             .kind = "create",
                             .state = d.next,
                             .outcome = cls_name(outcome),
                             .http_status = res.http_status,
                             .curl_code = res.curl_code,
                             .bytes_sent = res.bytes_sent,
                             .resp_headers = res.headers_json,
                             .resp_body = res.body,
                             .resp_body_len = res.body_len,
                             .error = error,
                             .retry_delay_ms = (long)d.delay_ms,
                             .outputs_received = rs.received,
                             .outputs_requested = -1,
                             .usage = rs.usage,
                             .started_at = t0,
                             .finished_at = t1};
    int applied = 0;
    int e = store_finish(db, &f, &applied);
    CRASH_POINT("after_result_commit");
    if (e < 0)
        LOG(LOG_ERROR, "dispatch_result_lost", LS("job_id", c->id), LI("store_error", e),
            LS("note", "the lease will expire and the reaper will mark it unknown"));
    else if (!applied)
        LOG(LOG_WARN, "fenced_write_dropped", LS("job_id", c->id),
            LI("lease_version", c->lease_version));
    else
        LOG(LOG_INFO, "dispatched", LS("job_id", c->id), LS("provider", c->provider),
            LS("outcome", cls_name(outcome)), LS("state", st_name(d.next)),
            LI("http_status", res.http_status), LI("curl_code", res.curl_code),
            LI("bytes_sent", res.bytes_sent), LI("attempt", c->transport_attempts),
            LI("delay_ms", d.delay_ms), LI("ms", (long long)((t1 - t0) * 1000)));
    if (applied && d.trip_credential) {
        char reason[128];
        snprintf(reason, sizeof(reason), "credential refused: HTTP %d", res.http_status);
        if (store_breaker_trip(db, c->provider, res.http_status, reason, c->id) == STORE_OK)
            LOG(LOG_ERROR, "provider_tripped", LS("provider", c->provider),
                LI("http_status", res.http_status), LS("job_id", c->id));
    }
    free(rs.usage);
    up_response_fini(&res);
}

int attempt_get(const struct cfg_provider *p, const char *credential, const char *url,
                struct up_response *res)
{
    char auth[1024];
    const char *secret = credential && *credential ? getenv(credential) : NULL;
    if (credential && *credential && (!secret || !*secret)) {
        memset(res, 0, sizeof(*res));
        snprintf(res->error, sizeof(res->error), "the provider's credential variable is not set");
        return -1;
    }
    if (secret)
        snprintf(auth, sizeof(auth), "%s%s", p->auth_prefix ? p->auth_prefix : "", secret);
    struct up_request req = {.method = "GET",
                             .url = url,
                             .auth_header = secret ? p->auth_header : NULL,
                             .auth_value = secret ? auth : NULL,
                             .connect_timeout_ms = p->connect_timeout_ms,
                             .total_timeout_ms = p->total_timeout_ms,
                             .max_response_bytes = MAX_RESPONSE_BYTES};
    int rc = up_call(&req, res);
    explicit_bzero(auth, sizeof(auth));
    return rc;
}
