#include "idemgate/attempt.h"

#include "idemgate/backoff.h"
#include "idemgate/classify.h"
#include "idemgate/crash.h"
#include "idemgate/crypto.h"
#include "idemgate/inject.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
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
    if (hint < 0 && ra) {
        /* An HTTP-date is read against the provider's own Date header when it sent one, so
         * this host's clock being off does not shorten the wait. */
        const char *date = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(h, "date"));
        long long their_now = date ? bo_retry_after_ms(date, 0) / 1000 : -1;
        hint = bo_retry_after_ms(ra, their_now > 0 ? their_now : (long long)time(NULL));
    }
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

int attempt_same_origin(const char *url, const char *base)
{
    /* scheme://host[:port] of base, then '/' or the end. */
    const char *p = strstr(base, "://");
    if (!p)
        return 0;
    const char *end = strchr(p + 3, '/');
    size_t n = end ? (size_t)(end - base) : strlen(base);
    return strncmp(url, base, n) == 0 && (url[n] == '/' || url[n] == '\0' || url[n] == '?');
}

/* Percent-encodes s for a query value. */
static void query_escape(const char *s, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *q = (const unsigned char *)s; *q && o + 4 < cap; q++) {
        if ((*q >= 'A' && *q <= 'Z') || (*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9') ||
            *q == '-' || *q == '.' || *q == '_' || *q == '~') {
            out[o++] = (char)*q;
        } else {
            out[o++] = '%';
            out[o++] = hex[*q >> 4];
            out[o++] = hex[*q & 15];
        }
    }
    out[o] = '\0';
}

/* The body as sent: the stored body (the client's, compacted) with our client reference and
 * webhook URL put in where the profile says (never re-printed: numbers stay as the client wrote
 * them). Returns a new buffer, or NULL to send the stored body unchanged. */
static char *outbound_body(const struct cfg_provider *p, const struct store_claim *c,
                           const char *webhook_url, size_t *len)
{
    char *body = NULL, *next = NULL;
    size_t blen = 0, nlen = 0;
    if (p->client_ref_body_field &&
        inject_member((const char *)c->body, c->body_len, p->client_ref_body_field, c->id, &body,
                      &blen) < 0)
        LOG(LOG_WARN, "client_ref_not_injected", LS("job_id", c->id),
            LS("field", p->client_ref_body_field));
    if (webhook_url && p->webhook_body_field) {
        const char *src = body ? body : (const char *)c->body;
        size_t slen = body ? blen : c->body_len;
        if (inject_member(src, slen, p->webhook_body_field, webhook_url, &next, &nlen) == 0) {
            free(body);
            body = next;
            blen = nlen;
        } else {
            LOG(LOG_WARN, "webhook_not_registered", LS("job_id", c->id),
                LS("field", p->webhook_body_field));
        }
    }
    *len = blen;
    return body;
}

/* For an async provider, a 2xx create is only "accepted": the task id (and a poll URL, when
 * given) come from its answer. Without a task id nothing says which task we paid for. */
static void accept_async(const struct cfg_provider *p, const struct up_response *res,
                         struct pol_decision *d, char **remote_id, char **poll_url,
                         const char **error)
{
    int ok = p->n_accepted_statuses == 0;
    for (int i = 0; i < p->n_accepted_statuses; i++)
        ok |= p->accepted_statuses[i] == res->http_status;
    cJSON *doc = res->body ? cJSON_ParseWithLength(res->body, res->body_len) : NULL;
    const cJSON *id = doc ? jpath_first(p->task_id, doc) : NULL;
    if (ok && cJSON_IsString(id) && *id->valuestring) {
        *remote_id = strdup(id->valuestring);
    } else if (ok && cJSON_IsNumber(id)) {
        char num[32];
        snprintf(num, sizeof(num), "%.0f", id->valuedouble);
        *remote_id = strdup(num);
    }
    const char *pu = doc && p->poll_url ? jpath_string(p->poll_url, doc) : NULL;
    if (pu && attempt_same_origin(pu, p->base_url))
        *poll_url = strdup(pu);
    else if (pu)
        LOG(LOG_WARN, "poll_url_refused", LS("provider", p->name),
            LS("reason", "not on the provider's base URL"));
    cJSON_Delete(doc);
    if (*remote_id) {
        d->next = ST_ACCEPTED;
        d->delay_ms = p->poll_interval_ms;
        *error = NULL;
    } else {
        d->next = ST_UNKNOWN;
        *error = ok ? "the provider accepted the create without a task id"
                    : "unexpected success status for a create";
    }
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
    const char *hdrs[17] = {"X-Idemgate-Operation", c->id};
    int h = 2;
    if (c->idem_header) {
        hdrs[h++] = c->idem_header;
        hdrs[h++] = c->id;
    }
    if (p->client_ref_header) {
        hdrs[h++] = p->client_ref_header;
        hdrs[h++] = c->id;
    }
    for (int i = 0; p->headers && p->headers[i] && h < 14; i += 2) {
        hdrs[h++] = p->headers[i];
        hdrs[h++] = p->headers[i + 1];
    }
    char webhook_url[1024], url[4096];
    int hook = *cfg->public_url && (p->webhook_body_field || p->webhook_url_query);
    snprintf(webhook_url, sizeof(webhook_url), "%s/v1/webhooks/%s", cfg->public_url, p->name);
    snprintf(url, sizeof(url), "%s", c->url);
    if (hook && p->webhook_url_query) {
        char esc[3 * sizeof(webhook_url)];
        query_escape(webhook_url, esc, sizeof(esc));
        snprintf(url, sizeof(url), "%s%c%s=%s", c->url, strchr(c->url, '?') ? '&' : '?',
                 p->webhook_url_query, esc);
    }
    size_t body_len = 0;
    char *body = outbound_body(p, c, hook ? webhook_url : NULL, &body_len);
    /* The whole call must fit in the lease: once it expires the reaper may hand the operation
     * to another worker, so the last moment to start sending leaves room for the provider's
     * total timeout. claimed_mono was taken before the claim, which only makes this earlier. */
    double deadline = claimed_mono + c->lease_remaining_s - LEASE_SEND_MARGIN_S -
                      (double)p->total_timeout_ms / 1000.0;
    struct up_request req = {.method = c->method,
                             .url = url,
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
    if (c->from_unknown && d.next == ST_FAILED) {
        /* An earlier send may have created the task: a refusal now does not prove that it
         * did not, so the operation stays unknown (and ends in review) rather than failed. */
        d.next = ST_UNKNOWN;
        error = "refused on a resend after an ambiguous attempt";
    }
    char *remote_id = NULL, *poll_url = NULL;
    if (p->mode == CFG_MODE_ASYNC_POLL && d.next == ST_COMPLETED)
        accept_async(p, &res, &d, &remote_id, &poll_url, &error);
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
                             .remote_id = remote_id,
                             .poll_url = poll_url,
                             .poll_deadline_ms = d.next == ST_ACCEPTED ? p->poll_deadline_ms : 0,
                             .provider_status = d.next == ST_ACCEPTED ? "queued" : NULL,
                             .started_at = t0,
                             .finished_at = t1};
    int applied = 0;
    int e = store_finish(db, &f, &applied);
    CRASH_POINT("after_result_commit");
    metrics_attempt(cls_name(outcome));
    if (outcome == CLS_AMBIGUOUS)
        metrics_safety(MS_AMBIGUOUS);
    if (e == STORE_OK && !applied)
        metrics_safety(MS_FENCED_WRITE);
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
    free(remote_id);
    free(poll_url);
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
