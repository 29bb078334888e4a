#include "idemgate/attempt.h"

#include "idemgate/archive.h"
#include "idemgate/backoff.h"
#include "idemgate/breaker.h"
#include "idemgate/classify.h"
#include "idemgate/credwatch.h"
#include "idemgate/clock.h"
#include "idemgate/crash.h"
#include "idemgate/engine.h"
#include "idemgate/inject.h"
#include "idemgate/lease.h"
#include "idemgate/livestream.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/multipart.h"
#include "idemgate/policy.h"
#include "idemgate/provider.h"
#include "idemgate/resultq.h"
#include "idemgate/resume.h"
#include "idemgate/secrets.h"
#include "idemgate/sse.h"
#include "idemgate/store.h"
#include "idemgate/upload.h"
#include "idemgate/uplstore.h"
#include "idemgate/utf8.h"
#include "idemgate/wake.h"

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* Margin kept between the last moment a worker may start sending and its lease's end, for
 * clock rate differences and the time the request takes to leave. */
#define LEASE_SEND_MARGIN_S 1.0
/* How long an operation that could not be sent here waits before any replica tries again. */
#define NOT_SENT_RETRY_MS 5000

/* Refuses to send once the lease is (nearly) over, by this host's clocks (clock_deadline): a
 * worker frozen past its lease — the process stopped, the host suspended, the virtual machine
 * paused — wakes up, finds its deadline gone, and sends nothing, because another replica may
 * own the operation by now. */
static int lease_guard(void *arg)
{
    const struct clock_deadline *send_by = arg;
    return clock_deadline_passed(send_by, clock_mono(), clock_wall()) ? -1 : 0;
}

/* Writes a result that needs no call: the operation was claimed but is not sent. `prepared`
 * lets any replica try again later; `failed` when it can never be sent as recorded. */
static void release_unsent(struct db *db, const struct store_claim *c, enum op_state next,
                           const char *why)
{
    ls_close_unfed(c->id); /* not sent here: a client of its live stream waits for the job */
    /* The reconciler's resend of an unknown create (reconciler.c, idempotent_resubmit) proved
     * nothing absent: whatever stops it here, it stays unknown, for the reconciler — inside its
     * window, under its checks — never `prepared`, which any dispatcher would send later as new,
     * perhaps after the provider forgot the key. */
    if (c->from_unknown && next == ST_PREPARED)
        next = ST_UNKNOWN;
    struct store_finish f;
    store_finish_init(&f, c, "create", ST_SENDING);
    f.state = next;
    f.outcome = cls_name(CLS_NOT_SENT);
    f.error = why;
    f.retry_delay_ms = NOT_SENT_RETRY_MS;
    int applied = 0;
    LOG(LOG_ERROR, "dispatch_not_sent", LS("job_id", c->id), LS("provider", c->provider),
        LS("error", why));
    if (store_finish(db, &f, &applied) < 0)
        LOG(LOG_WARN, "dispatch_result_lost", LS("job_id", c->id),
            LS("note", "the reaper will mark it unknown"));
}

/* A stored body whose upload parts are in the archive store (upload.h) is rebuilt from the row
 * and the objects, byte for byte, before anything reads it: on every send and resend. Returns 0
 * (c->body is the client's body), or -1 when nothing may be sent: the row was written back —
 * `prepared` to wait for the store, or what upl_unread_next says of an object gone for good;
 * a malformed table can never be sent as recorded (pol_unsendable). */
static int load_upload(const struct cfg *cfg, const struct cfg_provider *p, struct db *db,
                       struct store_claim *c)
{
    char why[300] = "", msg[420];
    char *body = NULL;
    size_t len = 0;
    if (c->body_rebuilt) /* the reconciler's resend rebuilt it before counting its attempt */
        return 0;
    int rc = ups_expand(cfg, (const char *)c->body, c->body_len, &body, &len, why, sizeof(why));
    if (rc == 1)
        return 0;
    if (rc == 0) {
        free(c->body);
        c->body = (unsigned char *)body;
        c->body_len = len;
        return 0;
    }
    int ambiguous = c->ambiguous_before || c->from_unknown;
    enum op_state next = rc < 0 ? pol_unsendable(ambiguous)
                                : upl_unread_next((enum upl_unread)rc, ambiguous,
                                                  c->since_first_ms, p->deadline_ms);
    const char *reason = upl_unread_reason(rc);
    LOG(LOG_ERROR, "upload_unreadable", LS("job_id", c->id), LS("provider", c->provider),
        LS("reason", reason), LS("error", why), LS("state", st_name(next)));
    snprintf(msg, sizeof(msg),
             "the upload could not be rebuilt from the archive store (%s: %s); nothing was sent%s",
             reason, why, next == ST_PREPARED ? ", tried again later" : "");
    release_unsent(db, c, next, msg);
    return -1;
}

long long attempt_server_hint_ms(const struct cfg_provider *p, const struct up_response *res)
{
    long long hint = -1;
    cJSON *h = res->headers_json ? cJSON_Parse(res->headers_json) : NULL;
    const char *ms = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(h, "retry-after-ms"));
    const char *ra = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(h, "retry-after"));
    if (ms)
        hint = bo_retry_after_ms_header(ms);
    if (hint < 0 && ra) {
        /* An HTTP-date is read against the provider's own Date header when it sent one, so
         * this host's clock being off does not shorten the wait. Only when that header is an
         * HTTP-date: delay-seconds there ("Date: 5") would put their now in 1970. */
        const char *date = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(h, "date"));
        while (date && (*date == ' ' || *date == '\t'))
            date++;
        long long their_now =
            date && !(*date >= '0' && *date <= '9') ? bo_retry_after_ms(date, 0) / 1000 : -1;
        hint = bo_retry_after_ms(ra, their_now > 0 ? their_now : (long long)time(NULL));
    }
    cJSON_Delete(h);
    if (hint < 0 && p->body_hint.ok && res->body)
        hint = bo_body_hint_ms(&p->body_hint, res->body, res->body_len);
    return hint;
}

int attempt_is_stream(const struct cfg_provider *p, const struct up_response *res)
{
    if (!p->stream_format || !res->headers_json)
        return 0;
    cJSON *h = cJSON_Parse(res->headers_json);
    const cJSON *ct = h ? cJSON_GetObjectItemCaseSensitive(h, "content-type") : NULL;
    int yes = cJSON_IsString(ct) && strncasecmp(ct->valuestring, "text/event-stream", 17) == 0;
    cJSON_Delete(h);
    return yes;
}

void attempt_count_results(const struct cfg_provider *p, const struct up_response *res,
                           struct attempt_results *out)
{
    out->received = -1;
    out->usage = NULL;
    out->stream_cut = 0;
    out->stream_whole = 0;
    out->stream_error_status = 0;
    out->stream_error_type[0] = '\0';
    out->stream_id[0] = '\0';
    out->stream_output = 0;
    out->unreadable = 0;
    if (attempt_is_stream(p, res)) {
        struct sse_verdict v;
        if (sse_read((enum sse_format)p->stream_format, res->body, res->body_len, &v) < 0) {
            out->stream_cut = 1; /* unread: never taken for complete */
            return;
        }
        out->stream_cut = !v.terminal || v.error || res->body_truncated;
        out->stream_whole = !out->stream_cut;
        out->stream_error_status = v.error && !v.output ? v.error_status : 0;
        memcpy(out->stream_error_type, v.error_type, sizeof(out->stream_error_type));
        memcpy(out->stream_id, v.id, sizeof(out->stream_id));
        out->stream_output = v.output;
        out->usage = v.usage;
        return;
    }
    if (res->body_truncated || (!p->outputs_received && !p->usage))
        return;
    const char *end = NULL;
    cJSON *doc = res->body ? cJSON_ParseWithLengthOpts(res->body, res->body_len, &end, 0) : NULL;
    if (!doc) {
        out->unreadable = p->mode != CFG_MODE_ASYNC_POLL;
        return;
    }
    if (p->outputs_received)
        out->received = (int)jpath_each(p->outputs_received, doc, NULL, NULL);
    const cJSON *u = p->usage ? jpath_first(p->usage, doc) : NULL;
    if (u && cJSON_IsObject(u))
        out->usage = cJSON_PrintUnformatted(u);
    cJSON_Delete(doc);
}

int attempt_same_origin(const char *url, const char *base)
{
    return prov_same_origin(url, base);
}

int attempt_needs_client_ref(const char *strategy)
{
    int r = prof_reconcile_parse(strategy);
    return r >= 0 && attempt_strategy_needs_client_ref((enum cfg_reconcile)r);
}

int attempt_strategy_needs_client_ref(enum cfg_reconcile strategy)
{
    return strategy == RECON_GET_BY_CLIENT_ID || strategy == RECON_LIST_MATCH;
}

/* The request as it leaves: URL (with a webhook query parameter), body (the stored client body
 * with our client reference and webhook URL put in where the profile says, never re-printed:
 * numbers stay as the client wrote them) and our headers. */
struct outbound {
    char *url;
    char *body; /* NULL: the stored body as it is */
    size_t body_len;
    const char *hdrs[9];
};

static void outbound_fini(struct outbound *o)
{
    free(o->url);
    free(o->body);
}

/* Puts value at field in the body being built (o->body, or the stored body when NULL). */
static int place(struct outbound *o, const struct store_claim *c, const char *field,
                 const char *value)
{
    const char *src = o->body ? o->body : (const char *)c->body;
    size_t slen = o->body ? o->body_len : c->body_len;
    char *next = NULL;
    size_t nlen = 0;
    int e = inject_member(src, slen, field, value, &next, &nlen);
    if (e < 0)
        return e;
    free(o->body);
    o->body = next;
    o->body_len = nlen;
    return 0;
}

/* Builds the outbound request; returns 0, or -1 with *why when it must not be sent: a create
 * whose reconciliation depends on its client reference never leaves without it. */
static int build_outbound(const struct cfg *cfg, const struct cfg_provider *p,
                          const struct store_claim *c, struct outbound *o, const char **why)
{
    int h = 0;
    memset(o, 0, sizeof(*o));
    /* The client reference and the provider idempotency key are derived from the operation,
     * never from the client's own key, and are the same on every transport retry. */
    o->hdrs[h++] = "X-Idemgate-Operation";
    o->hdrs[h++] = c->id;
    if (c->idem_header) {
        o->hdrs[h++] = c->idem_header;
        o->hdrs[h++] = c->id;
    }
    if (p->client_ref_header) {
        o->hdrs[h++] = p->client_ref_header;
        o->hdrs[h++] = c->id;
    }
    /* A multipart upload is sent as the client sent it: nothing is placed in it (the intake
     * refuses one where reconciliation needs the reference there). */
    char mpt[MP_CTYPE_MAX];
    int json = !mp_content_type_of((const char *)c->body, c->body_len, mpt, sizeof(mpt));
    if (json && p->client_ref_body_field && place(o, c, p->client_ref_body_field, c->id) < 0) {
        if (attempt_strategy_needs_client_ref(c->strategy)) {
            *why = "the client reference cannot be placed in the body; reconciliation depends on "
                   "it, so the create is not sent";
            return -1;
        }
        LOG(LOG_WARN, "client_ref_not_injected", LS("job_id", c->id),
            LS("field", p->client_ref_body_field));
    }
    int hook = *cfg->public_url && (p->webhook_body_field || p->webhook_url_query);
    char *webhook_url = NULL;
    if (hook && asprintf(&webhook_url, "%s/v1/webhooks/%s", cfg->public_url, p->name) < 0)
        webhook_url = NULL;
    if (json && webhook_url && p->webhook_body_field &&
        place(o, c, p->webhook_body_field, webhook_url) < 0)
        LOG(LOG_WARN, "webhook_not_registered", LS("job_id", c->id),
            LS("field", p->webhook_body_field));
    char *esc = webhook_url && p->webhook_url_query ? prov_query_escape(webhook_url) : NULL;
    int n = esc ? asprintf(&o->url, "%s%c%s=%s", c->url, strchr(c->url, '?') ? '&' : '?',
                           p->webhook_url_query, esc)
                : asprintf(&o->url, "%s", c->url);
    free(esc);
    free(webhook_url);
    if (n < 0) {
        o->url = NULL;
        *why = "out of memory";
        return -1;
    }
    return 0;
}

void attempt_read_task(const struct cfg_provider *p, const struct up_response *res,
                       struct attempt_task *t)
{
    t->status_listed = p->n_accepted_statuses == 0;
    for (int i = 0; i < p->n_accepted_statuses; i++)
        t->status_listed |= p->accepted_statuses[i] == res->http_status;
    cJSON *doc = prov_id_doc(res->body, res->body_len);
    const char *id = t->status_listed && doc ? prov_read_id(p->task_id, doc) : NULL;
    if (id)
        t->remote_id = strdup(id);
    const char *pu = doc && p->poll_url ? jpath_string(p->poll_url, doc) : NULL;
    int utf8 = pu && utf8_valid(pu, strlen(pu));
    if (pu && utf8 && prov_same_origin(pu, p->base_url))
        t->poll_url = strdup(pu);
    else if (pu)
        LOG(LOG_WARN, "poll_url_refused", LS("provider", p->name),
            LS("reason", utf8 ? "not on the provider's base URL" : "not UTF-8"));
    cJSON_Delete(doc);
}

int attempt_read_deferred(const struct cfg_provider *p, const struct up_response *res,
                          struct attempt_task *t)
{
    if (p->mode == CFG_MODE_ASYNC_POLL || !p->status_path || !p->task_path || !res->body ||
        res->body_truncated || attempt_is_stream(p, res))
        return -1;
    cJSON *doc = prov_id_doc(res->body, res->body_len);
    int ts = doc ? prof_task_status(p, res->http_status, doc) : -1;
    if (ts != TS_QUEUED && ts != TS_RUNNING && ts != TS_FAILED && ts != TS_CANCELED) {
        cJSON_Delete(doc);
        return -1;
    }
    const char *id = prov_read_id(p->task_id, doc);
    t->status_listed = 1;
    if (id)
        t->remote_id = strdup(id);
    cJSON_Delete(doc);
    return ts;
}

/* Logs and counts what the write of an outcome did. */
static void report(const struct store_claim *c, int e, int applied, enum cls_outcome outcome,
                   const struct pol_decision *d, const struct up_response *res, double ms)
{
    metrics_attempt(c->provider, cls_name(outcome));
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
            LS("outcome", cls_name(outcome)), LS("state", st_name(d->next)),
            LI("http_status", res->http_status), LI("curl_code", res->curl_code),
            LI("bytes_sent", res->bytes_sent), LI("attempt", c->transport_attempts),
            LI("delay_ms", d->delay_ms), LI("ms", (long long)ms));
}

/* Classifies one call's evidence; *may_have_created says whether it leaves open that the
 * attempt made a task (cls_may_have_created). */
static enum cls_outcome classify(const struct cfg_provider *p, const struct store_claim *c,
                                 const struct up_response *res, const struct attempt_results *rs,
                                 int *may_have_created)
{
    int requested = c->outputs_requested;
    struct cls_evidence ev = {.curl_code = res->curl_code,
                              .bytes_sent = res->bytes_sent,
                              .header_bytes = res->header_bytes,
                              .http_status = res->http_status,
                              .stream_cut = rs->stream_cut,
                              .stream_error_status = rs->stream_error_status,
                              .resend_refused = res->resend_refused,
                              .outputs_short = requested > 0 && rs->received >= 0 &&
                                               rs->received < requested,
                              .idempotent = c->idem_header != NULL,
                              .not_created = p->not_created,
                              .n_not_created = p->n_not_created,
                              .trip = p->trip_statuses,
                              .n_trip = p->n_trip_statuses,
                              .body = res->body,
                              .body_len = res->body_len,
                              .markers = (const char *const *)p->trip_markers,
                              .n_markers = p->n_trip_markers,
                              .stream_whole = rs->stream_whole};
    enum cls_outcome o = res->aborted_before_send ? CLS_NOT_SENT : cls_classify(&ev);
    *may_have_created = cls_may_have_created(&ev, o);
    return o;
}

/* Decides what follows (policy.c owns the decision; every input is gathered here). */
static struct pol_decision decide(const struct cfg_provider *p, const struct store_claim *c,
                                  const struct up_response *res, enum cls_outcome outcome,
                                  int may_have_created, const struct attempt_task *t,
                                  int read_back, int deferred, int unreadable, double seconds)
{
    int waits = pol_needs_wait_inputs(outcome);
    struct pol_input in = {.outcome = outcome,
                           .attempts_made = c->transport_attempts,
                           .max_attempts = p->max_attempts,
                           .elapsed_ms = c->since_first_ms + (long long)(seconds * 1000),
                           .deadline_ms = p->deadline_ms,
                           .hint_ms = waits ? attempt_server_hint_ms(p, res) : -1,
                           .base_ms = p->backoff_base_ms,
                           .cap_ms = p->backoff_cap_ms,
                           .rand01 = waits ? clock_rand01() : 0.5,
                           .ambiguous_before = c->ambiguous_before || c->from_unknown,
                           .from_unknown = c->from_unknown,
                           .may_have_created = may_have_created,
                           .truncated = res->body_truncated,
                           .unreadable = unreadable,
                           .cannot_look = p->reconcile == RECON_NONE && !read_back,
                           .reconcile_interval_ms = p->reconcile_interval_ms,
                           .recovery_window_ms = p->recovery_window_ms,
                           .async = p->mode == CFG_MODE_ASYNC_POLL || deferred,
                           .task_id_read = t->remote_id != NULL,
                           .status_listed = t->status_listed,
                           .poll_interval_ms = p->poll_interval_ms};
    return pol_decide(&in);
}

/* The operation's last_error for decision d: after a whole answer the policy's reason is the
 * whole message; otherwise the evidence (libcurl's error or the status) is added to it. */
static const char *last_error(const struct pol_decision *d, const struct up_response *res,
                              const struct attempt_results *rs, int whole, char *buf, size_t len)
{
    if (res->aborted_before_send) /* refused by the send's check, or never built */
        return res->curl_code || !res->error[0] ? "lease expired before sending" : res->error;
    if (whole)
        return d->reason;
    if (rs->stream_cut && !res->curl_code && rs->stream_error_status)
        snprintf(buf, len, "%s: HTTP %d, then an error event %s before any output (as HTTP %d)",
                 d->reason, res->http_status, rs->stream_error_type, rs->stream_error_status);
    else if (rs->stream_cut && !res->curl_code && rs->stream_error_type[0])
        snprintf(buf, len, "%s: HTTP %d, then an error event %s", d->reason,
                 res->http_status, rs->stream_error_type);
    else if (rs->stream_cut && !res->curl_code)
        snprintf(buf, len, "%s: HTTP %d, the stream ended without its terminal event",
                 d->reason, res->http_status);
    else if (res->curl_code)
        snprintf(buf, len, "%s: %s", d->reason, res->error);
    else
        snprintf(buf, len, "%s: HTTP %d", d->reason, res->http_status);
    return buf;
}

/* A born reservation (recorded `prepared` for this replica, and queued until a worker was free)
 * becomes a send: it is moved to `sending` by a conditional statement right before the send, so
 * a cancel acknowledged meanwhile, a credential tripped meanwhile, or another replica's claim of
 * an expired reservation each stop it, however long or short it waited. Returns 0 to send, -1
 * when it is not ours to send (nothing left). */
/* A born reservation whose start statement lost its connection: the move may have committed.
 * Nothing was sent either way, so a `sending` row under our token is written back to `prepared`
 * (fenced, and harmless, when the move never committed: the row is then still a reservation). */
static void born_lost(struct db *db, const struct store_claim *c)
{
    release_unsent(db, c, ST_PREPARED, "the statement starting the send lost its connection");
    /* Whether or not the move committed (then written back above), nothing was sent: the
     * reservation is given back, due now for any replica, rather than left to end with its lease
     * (lease_seconds after the intake). */
    int released = 0, tripped = 0;
    if (lease_release_reservation(db, c, 0, &released, &tripped) < 0)
        LOG(LOG_WARN, "reservation_kept", LS("job_id", c->id),
            LS("note", "still prepared: due again when its reservation ends"));
    else if (released)
        wake_work(); /* due for any replica: they are told, not left to their polls */
}

/* A born reservation its start statement refused (error e, not STORE_ENOTFOUND) or found not
 * sendable (STORE_ENOTFOUND): given back, or left to end with its lease. */
static void born_refused(struct db *db, const struct store_claim *c, int e)
{
    ls_close_unfed(c->id); /* another claim of the job may feed it by now */
    if (e != STORE_ENOTFOUND) {
        /* Refused: still `prepared` — nothing was sent, and no operator is ever needed. The
         * reservation ends with its lease; any replica then sends it. */
        LOG(LOG_WARN, "dispatch_begin_failed", LS("job_id", c->id), LI("error", e),
            LS("note", "not sent; still prepared, due again when its reservation ends"));
        return;
    }
    int released = 0, tripped = 0;
    if (lease_release_reservation(db, c, 0, &released, &tripped) == STORE_OK && released)
        LOG(LOG_WARN, "dispatch_held", LS("job_id", c->id), LS("provider", c->provider),
            LS("reason", tripped ? "the provider's credential is tripped" : "not sendable"));
    else
        LOG(LOG_INFO, "dispatch_skipped", LS("job_id", c->id),
            LS("reason", "canceled, or taken by another replica, before it was sent"));
}

static int begin_born(const struct cfg *cfg, struct db *db, struct store_claim *c)
{
    int e = lease_begin_send(db, c, cfg->lease_seconds);
    if (e == STORE_OK)
        return 0;
    if (e == STORE_EUNAVAIL)
        born_lost(db, c);
    else
        born_refused(db, c, e);
    return -1;
}

int attempt_begin_born_many(const struct cfg *cfg, struct db *db, struct store_claim *const *cs,
                            size_t n, int *begun)
{
    int e = n ? lease_begin_send_many(db, cs, n, cfg->lease_seconds, begun) : STORE_OK;
    for (size_t i = 0; i < n; i++) {
        if (e == STORE_OK) {
            if (!begun[i])
                born_refused(db, cs[i], STORE_ENOTFOUND);
        } else if (e == STORE_EUNAVAIL) {
            begun[i] = 0;
            born_lost(db, cs[i]);
        } else { /* nothing committed: one by one */
            begun[i] = begin_born(cfg, db, cs[i]) == 0;
        }
    }
    return e;
}

/* The lease of a create in flight, kept while the call runs (attempt_tick): shared by the
 * attempt and the renewals queued for a writer, so that one outliving the attempt is harmless. */
struct keeper {
    atomic_int refs;
    atomic_llong end_ms; /* clock_mono() ms at which the lease as last written ends, less the
                          * margin: the call is cut there */
    atomic_int pending;  /* a renewal is queued or running */
    atomic_int lost;     /* a renewal found the row no longer this call's: none is tried again */
    long long tenant_id, lease_version;
    int lease_seconds;
    char id[64];
};

static void keeper_release(struct keeper *k)
{
    if (k && atomic_fetch_sub(&k->refs, 1) == 1)
        free(k);
}

/* A create between its start (the row is `sending` under our lease) and its record. */
struct attempt {
    const struct cfg_provider *p;
    struct store_claim c; /* owned */
    struct outbound o;
    struct clock_deadline send_by; /* the last moment the request may start leaving */
    double lease_end; /* when the lease ends, by this host's monotonic clock */
    struct keeper *keeper; /* its lease kept while the call runs (a dispatcher's create), or NULL */
    int lease_seconds;     /* the replica's lease (cfg), as each renewal writes it */
    double t0, t1;    /* wall clock when the call was started and when it ended */
    /* Its outcome (attempt_outcome), until it is written. */
    struct up_response res;
    struct attempt_results rs;
    struct attempt_task t;
    struct pol_decision d;
    enum cls_outcome outcome;
    struct store_finish f;
    int written; /* the state f's write wrote, -1: none (f.written points here) */
    char *plan; /* f's archive plan */
    struct archive_born born; /* its outputs the write claims for this replica's archive */
    int unpriced;
    int classified;       /* attempt_ready classified the answer */
    int probe_due;        /* the outcome asks the provider's probe about the credential */
    int probed;           /* and its class is known */
    enum cls_probe probe; /* what it answered */
    char msg[400];
    struct ls *ls; /* the live stream its waiting clients read (livestream.h), or NULL */
    /* The id its stream names, kept on the row while the call goes on (attempt_note_ids): the
     * queue a writer takes the note from, the stream's first bytes read for it, and whether it
     * is still looked for. */
    struct rq *notes;
    char *head;
    size_t head_len;
    int id_looked_for;
    char head_id[128]; /* the id the first bytes named: kept if the record cannot be read back */
    int stream_sent; /* the request asked the provider for a stream */
    /* The record kept on the row in batches while the stream runs (note_partial): the bytes
     * since the last batch, how many were queued before them, and when. */
    int partial_on;
    char *pend;
    size_t pend_len, pend_cap, noted;
    double noted_at;
    int kept; /* the live stream keeps the stream's bytes: the record is read from it */
};

/* What is read of a stream's beginning for the id it names: its first events. */
#define STREAM_HEAD_MAX 16384

struct id_note {
    struct rq_item node;
    long long tenant_id, lease_version;
    char job_id[64];
    char remote_id[128];
};

static void write_note(struct rq_item *it, struct db *db)
{
    struct id_note *n = (struct id_note *)it;
    if (store_note_remote(db, n->tenant_id, n->job_id, n->lease_version, n->remote_id) < 0)
        LOG(LOG_WARN, "stream_id_not_kept", LS("job_id", n->job_id),
            LS("note", "kept only with the result: if this replica dies first, the job cannot "
                       "be read back and goes to review"));
    free(n);
}

/* Bytes of a stream still arriving, queued for a writer to keep on the row (note_partial). */
struct partial_note {
    struct rq_item node;
    long long tenant_id, lease_version, offset;
    char job_id[64];
    char *bytes;   /* the batch, or NULL: it is read from the live stream */
    struct ls *ls; /* (referenced) */
    size_t len;
};

static void write_partial(struct rq_item *it, struct db *db)
{
    struct partial_note *n = (struct partial_note *)it;
    int kept = 0;
    if (!n->bytes && n->ls && (n->bytes = malloc(n->len ? n->len : 1)) &&
        ls_copy(n->ls, (size_t)n->offset, n->len, n->bytes) < 0) {
        free(n->bytes);
        n->bytes = NULL;
    }
    ls_release(n->ls);
    if (!n->bytes ||
        store_note_partial(db, n->tenant_id, n->job_id, n->lease_version, n->bytes, n->len,
                           n->offset, &kept) < 0 ||
        !kept)
        LOG(LOG_DEBUG, "stream_batch_not_kept", LS("job_id", n->job_id), LI("offset", n->offset),
            LS("note", "the call has ended, or an earlier batch was not kept: the record is "
                       "written whole with the result"));
    free(n->bytes);
    free(n);
}

/* A stream longer than this since its last batch is no longer kept in batches (memory). */
#define PARTIAL_PENDING_MAX (8u << 20)

/* Queues the bytes pending since the last batch for a writer (note_partial). 0, or -1 when
 * nothing more is kept in batches. */
static int push_partial(struct attempt *a, double now)
{
    struct partial_note *note = calloc(1, sizeof(*note));
    if (!note || strlen(a->c.id) >= sizeof(note->job_id)) {
        free(note);
        a->partial_on = 0;
        return -1;
    }
    note->node.write = write_partial;
    note->tenant_id = a->c.tenant_id;
    note->lease_version = a->c.lease_version;
    note->offset = (long long)a->noted;
    memcpy(note->job_id, a->c.id, strlen(a->c.id) + 1);
    note->bytes = a->pend;
    if (a->kept) {
        ls_hold(a->ls);
        note->ls = a->ls;
    }
    note->len = a->pend_len;
    a->noted += a->pend_len;
    a->pend = NULL;
    a->pend_len = a->pend_cap = 0;
    a->noted_at = now;
    rq_push(a->notes, &note->node);
    return 0;
}

/* The record so far, kept on the row in batches as it arrives (resume_note_due): if this
 * replica dies mid-stream, what arrived is not lost with it — the reconciler resumes a
 * background Responses stream after its last whole event, and an operator sees what was
 * generated. The bytes of each batch go to a writer thread: read there from the live stream
 * when it keeps them (a->kept: nothing is copied here), else copied here; the transfer or the
 * live stream keeps the whole. */
static void keep_partial(struct attempt *a, const char *p, size_t n)
{
    if (a->pend_len + n > PARTIAL_PENDING_MAX) {
        a->partial_on = 0;
        free(a->pend);
        a->pend = NULL;
        return;
    }
    /* Never more of it on the row than the profile's max_response_bytes: what arrived before
     * the bound is kept as a last batch (the transfer's own copy stops at the same bound), and
     * the record ends there. */
    if (a->noted + a->pend_len + n > a->p->max_response_bytes) {
        if (a->pend_len)
            (void)push_partial(a, clock_mono());
        free(a->pend);
        a->pend = NULL;
        a->pend_len = a->pend_cap = 0;
        a->partial_on = 0;
        return;
    }
    if (a->kept) {
        a->pend_len += n;
    } else if (a->pend_len + n > a->pend_cap) {
        size_t cap = a->pend_cap ? a->pend_cap : 4096;
        while (cap < a->pend_len + n)
            cap *= 2;
        char *b = realloc(a->pend, cap);
        if (!b) {
            a->partial_on = 0;
            return;
        }
        a->pend = b;
        a->pend_cap = cap;
    }
    if (!a->kept) {
        memcpy(a->pend + a->pend_len, p, n);
        a->pend_len += n;
    }
    double now = clock_mono();
    if (resume_note_due(a->noted, a->pend_len, now - a->noted_at))
        (void)push_partial(a, now);
}

/* The stream's bytes as they arrive, on an engine thread: to its live clients, kept on the row
 * in batches, and read for the id it names until one is found (then queued for a writer,
 * once). */
static void on_stream(void *arg, const char *p, size_t n)
{
    struct attempt *a = arg;
    if (a->ls)
        ls_feed(a->ls, p, n);
    if (a->partial_on && a->notes)
        keep_partial(a, p, n);
    if (!a->id_looked_for)
        return;
    size_t take = n < STREAM_HEAD_MAX - a->head_len ? n : STREAM_HEAD_MAX - a->head_len;
    if (!a->head && !(a->head = malloc(STREAM_HEAD_MAX))) {
        a->id_looked_for = 0;
        return;
    }
    memcpy(a->head + a->head_len, p, take);
    a->head_len += take;
    struct sse_verdict v;
    if (sse_read((enum sse_format)a->p->stream_format, a->head, a->head_len, &v) < 0)
        return;
    sse_verdict_fini(&v);
    if (v.id[0])
        memcpy(a->head_id, v.id, sizeof(a->head_id));
    if (v.id[0] && a->notes) {
        struct id_note *note = calloc(1, sizeof(*note));
        if (note && strlen(a->c.id) < sizeof(note->job_id)) {
            note->node.write = write_note;
            note->tenant_id = a->c.tenant_id;
            note->lease_version = a->c.lease_version;
            memcpy(note->job_id, a->c.id, strlen(a->c.id) + 1);
            memcpy(note->remote_id, v.id, sizeof(note->remote_id));
            rq_push(a->notes, &note->node);
        } else {
            free(note);
        }
    }
    if (v.id[0] || a->head_len == STREAM_HEAD_MAX || v.events >= 4)
        a->id_looked_for = 0; /* found, or not in the first events: not looked for further */
}

void attempt_note_ids(struct attempt *a, struct rq *notes)
{
    a->notes = notes;
}

/* A renewal of a create's lease, queued for a writer (attempt_tick). */
struct renew_note {
    struct rq_item node;
    struct keeper *k; /* (referenced) */
};

static void write_renew(struct rq_item *it, struct db *db)
{
    struct renew_note *n = (struct renew_note *)it;
    struct keeper *k = n->k;
    double before = clock_mono(); /* the lease written counts from before the statement */
    int kept = 0;
    if (!atomic_load(&k->lost) &&
        lease_renew_send(db, k->tenant_id, k->id, k->lease_version, k->lease_seconds, &kept) ==
            STORE_OK) {
        if (kept) {
            atomic_store(&k->end_ms,
                         (long long)((before + k->lease_seconds - LEASE_SEND_MARGIN_S) * 1000.0));
        } else {
            atomic_store(&k->lost, 1);
            LOG(LOG_WARN, "lease_not_kept", LS("job_id", k->id),
                LS("note", "the row is no longer this call's (its lease ended, or it was taken): "
                           "the call is cut at its lease's end"));
        }
    }
    atomic_store(&k->pending, 0); /* a failed write is tried again at the next tick */
    keeper_release(k);
    free(n);
}

int attempt_tick(void *arg)
{
    struct attempt *a = arg;
    struct keeper *k = a->keeper;
    if (!k)
        return 0;
    long long now = (long long)(clock_mono() * 1000.0), end = atomic_load(&k->end_ms);
    if (now >= end)
        return 1; /* the lease as written is over: another replica may take the row */
    /* Renewed once half the lease is left: a writer and the database have the other half. */
    if (end - now < (long long)k->lease_seconds * 500 && !atomic_load(&k->lost) &&
        !atomic_exchange(&k->pending, 1)) {
        struct renew_note *n = calloc(1, sizeof(*n));
        if (!n) {
            atomic_store(&k->pending, 0);
            return 0;
        }
        n->node.write = write_renew;
        atomic_fetch_add(&k->refs, 1);
        n->k = k;
        rq_push(a->notes, &n->node);
    }
    return 0;
}

static void attempt_free(struct attempt *a)
{
    /* Recorded (or abandoned, perhaps before its transfer was made): the job's clients read
     * the record from now on. Its own stream, or one nobody feeds: never the stream a later
     * claim of the job attached meanwhile. */
    if (a->ls) {
        ls_close_own(a->ls);
        ls_release(a->ls);
    } else {
        ls_close_unfed(a->c.id);
    }
    outbound_fini(&a->o);
    store_claim_fini(&a->c);
    up_response_fini(&a->res);
    free(a->rs.usage);
    free(a->t.remote_id);
    free(a->t.poll_url);
    /* Never written (or its outputs already handed over): the archive's room is given back. */
    archive_born_settle(&a->born, 0, 0, NULL, NULL, NULL, NULL);
    free(a->plan);
    free(a->head);
    free(a->pend);
    keeper_release(a->keeper);
    free(a);
}

/* The stream the live copy kept becomes the answer's body: all of it, or, when some bytes were
 * not kept (past max_response_bytes, out of memory or spool) or it cannot be read back,
 * whatever was, marked truncated — never taken for a complete answer. */
static void record_from_live(struct attempt *a, struct up_response *res)
{
    char *b = NULL;
    size_t n = 0;
    int whole = 0;
    if (ls_record(a->ls, &b, &n, &whole) < 0) {
        res->body_truncated = 1;
        return;
    }
    res->body = b;
    res->body_len = n;
    if (!whole)
        res->body_truncated = 1;
}

int attempt_classify(struct attempt *a, struct up_response *res, double t1)
{
    const struct cfg_provider *p = a->p;
    const struct store_claim *c = &a->c;
    a->res = *res;
    memset(res, 0, sizeof(*res));
    a->t1 = t1;
    res = &a->res;
    if (res->curl_code || !res->http_status)
        LOG(LOG_DEBUG, "create_no_answer", LS("job_id", c->id), LS("error", res->error));
    CRASH_POINT("after_response");
    if (a->kept && ls_began(a->ls) && !res->body)
        record_from_live(a, res);
    attempt_count_results(p, res, &a->rs);
    if (a->ls)
        ls_attempt_end(a->ls, a->rs.stream_cut || (res->curl_code != 0 && !a->rs.stream_whole));
    /* A stream that named its generation, where the provider keeps it and the profile says how
     * to read it (reconcile.task.path): if the stream is left in doubt, the reconciler reads it
     * back by that id at once — a found task is the truth — rather than wait for the window.
     * An error event there is not judged by its type either: the generation it named may go on
     * at the provider, so it is read back, never sent again on the event's word. */
    int by_id = p->mode != CFG_MODE_ASYNC_POLL && p->task_path;
    int read_back = by_id && a->rs.stream_id[0];
    if (read_back)
        a->rs.stream_error_status = 0;
    int may_have_created = 0;
    a->outcome = classify(p, c, res, &a->rs, &may_have_created);
    int whole = (a->outcome == CLS_SUCCESS || a->outcome == CLS_PARTIAL) && !res->body_truncated;
    if (whole && p->mode == CFG_MODE_ASYNC_POLL)
        attempt_read_task(p, res, &a->t);
    /* A synchronous create answered with its task still in progress (a background response):
     * followed as an async task is, by its id; one answered failed or cancelled is failed
     * (attempt_read_deferred). */
    int deferred = whole ? attempt_read_deferred(p, res, &a->t) : -1;
    int in_progress = deferred == TS_QUEUED || deferred == TS_RUNNING;
    a->d = decide(p, c, res, a->outcome, may_have_created, &a->t, read_back, in_progress,
                  a->rs.unreadable, a->t1 - a->t0);
    if ((deferred == TS_FAILED || deferred == TS_CANCELED) && a->d.next == ST_COMPLETED) {
        a->d.next = ST_FAILED;
        a->d.reason = "the provider answered with the task failed or cancelled";
    }
    /* The row keeps the id this attempt's stream named, or none: an earlier attempt's id (its
     * stream refused before any output, then backed off) must never be read back for this one.
     * The id its first bytes named stands when the record could not be read back whole (out of
     * memory or a spool read failed): that generation can still be read back or resumed. */
    if (by_id && a->stream_sent && !a->t.remote_id)
        a->t.remote_id = strdup(a->rs.stream_id[0] ? a->rs.stream_id : a->head_id); /* "" clears */
    /* A stream cut after it carried output, where the profile cannot read the generation back
     * (Chat Completions, Messages): its id is kept all the same — never read by this replica
     * (reconcile reads by id only with reconcile.task), it is the proof of a paid generation on
     * which an `absent` resolution is refused (jobs.c, 409 task-known). Without it, a tenant's
     * `absent` sent the job again: a second generation. */
    if (!by_id && a->stream_sent && !a->t.remote_id && a->rs.stream_cut && a->rs.stream_output &&
        a->rs.stream_id[0])
        a->t.remote_id = strdup(a->rs.stream_id);
    struct store_finish *f = &a->f;
    store_finish_init(f, c, "create", ST_SENDING);
    a->written = -1;
    f->written = &a->written;
    if (a->keeper) { /* renewed: the lease left now, as last written, when that is longer */
        double left = (double)atomic_load(&a->keeper->end_ms) / 1000.0 - clock_mono() +
                      LEASE_SEND_MARGIN_S;
        if (left > f->lease_remaining_s)
            f->lease_remaining_s = left;
    }
    store_finish_evidence(f, res, 1);
    f->state = a->d.next;
    f->outcome = cls_name(a->outcome);
    f->error = last_error(&a->d, res, &a->rs, whole, a->msg, sizeof(a->msg));
    f->retry_delay_ms = (long)a->d.delay_ms;
    f->outputs_received = a->rs.received;
    f->usage = a->rs.usage;
    f->remote_id = a->t.remote_id;
    f->poll_url = a->t.poll_url;
    f->poll_deadline_ms = a->d.next == ST_ACCEPTED ? p->poll_deadline_ms : 0;
    f->provider_status = a->d.next != ST_ACCEPTED ? NULL
                         : deferred >= 0         ? prof_status_name((enum task_status)deferred)
                                                 : "queued";
    f->ambiguous = a->d.ambiguous;
    f->started_at = a->t0;
    f->finished_at = a->t1;
    /* What the provider charges for what it delivered (a partial result: its outputs only). */
    if (a->d.next == ST_COMPLETED && p->pricing.present &&
        price_currency_fits(&p->pricing, c->currency))
        f->cost_micros = price_actual_raw(&p->pricing, (const char *)c->body, c->body_len,
                                          c->outputs_requested, a->rs.received, a->rs.usage,
                                          &a->unpriced);
    /* A completed result is written with its outputs' archive plan (no second write), the
     * fetched outputs this replica's archive has room for claimed by the write itself. */
    archive_born_settle(&a->born, 0, 0, NULL, NULL, NULL, NULL); /* a plan made before */
    free(a->plan);
    f->archive_plan = a->plan = archive_plan_json(p, f, c->remote_id, c->credential, &a->born);
    f->born = &a->born;
    a->probe_due = a->d.trip_credential;
    return a->probe_due;
}

/* What is left of the lease for the probe, in ms. */
static long probe_budget_ms(const struct attempt *a)
{
    return (long)((a->lease_end - clock_mono()) * 1000);
}

struct up_xfer *attempt_probe_xfer(struct attempt *a)
{
    struct up_xfer *x = breaker_probe_xfer(a->p, probe_budget_ms(a), &a->probe);
    a->probed = x == NULL;
    return x;
}

void attempt_probed(struct attempt *a, struct up_response *res)
{
    a->probe = breaker_probe_class(a->p, res);
    a->probed = 1;
    up_response_fini(res);
}

const struct store_finish *attempt_ready(struct attempt *a, struct db *db, struct eng *e,
                                         struct up_response *res, double t1,
                                         eng_done_fn probe_done, void *arg)
{
    if (!a->classified) {
        a->classified = 1;
        if (attempt_classify(a, res, t1)) {
            struct up_xfer *x = attempt_probe_xfer(a);
            if (x) {
                eng_acquire_more(e); /* the probe follows the create: it keeps its place */
                eng_submit(e, -1, x, probe_done, arg);
                return NULL;
            }
        }
    }
    return attempt_decided(a, db);
}

const struct store_finish *attempt_decided(struct attempt *a, struct db *db)
{
    /* The refusal is a fact about the credential whatever becomes of this job's write: the
     * breaker is recorded first, so that a client that sees the job failed also sees the
     * provider tripped, and claims stop as early as they can. The probe is made within what is
     * left of the lease (here, when no call engine made it). */
    if (a->probe_due && !a->probed) {
        a->probe = breaker_probe(a->p, probe_budget_ms(a));
        a->probed = 1;
    }
    if (a->probe_due &&
        !breaker_trip_confirmed(a->p, db, a->c.id, a->res.http_status, a->probe))
        a->f.error = "the provider refused this request; its probe shows the credential works, "
                     "so it is not tripped";
    return &a->f;
}

const struct store_finish *attempt_outcome(struct attempt *a, struct db *db,
                                           struct up_response *res, double t1)
{
    (void)attempt_classify(a, res, t1);
    return attempt_decided(a, db);
}

void attempt_recorded(struct attempt *a, int e, int applied)
{
    CRASH_POINT("after_result_commit");
    /* Its outputs claimed by the write go to the archive threads (the rest of the room back);
     * those its plan ended are said. */
    if (e == STORE_OK && applied && a->f.state == ST_COMPLETED)
        archive_plan_written(a->plan, a->c.id, a->p->name);
    archive_born_settle(&a->born, e == STORE_OK && applied && a->f.state == ST_COMPLETED,
                        a->c.tenant_id, a->c.id, a->p->name,
                        a->f.remote_id ? a->f.remote_id : a->c.remote_id, a->plan);
    /* Its live readers get the held terminal event only once it is the record: the job's end
     * as written (never a refusal written to be sent again — a stream's 429 event before any
     * output — nor one a webhook's hint made unknown). */
    if (a->ls)
        ls_settle(a->ls, e == STORE_OK && applied && a->written >= 0 &&
                             st_is_terminal((enum op_state)a->written));
    if (e == STORE_OK && applied && a->f.cost_micros >= 0)
        metrics_spend(a->p->name, a->p->pricing.currency, a->f.cost_micros, a->unpriced);
    if (a->t0 > 0 && a->t1 >= a->t0)
        metrics_upstream_seconds(a->p->name, a->t1 - a->t0);
    /* Completed by this create: since the first send (an earlier attempt's, for a resend). */
    if (e == STORE_OK && applied && a->d.next == ST_COMPLETED)
        metrics_job_seconds(a->p->name, (double)a->c.since_first_ms / 1000 + (a->t1 - a->t0));
    report(&a->c, e, applied, a->outcome, &a->d, &a->res, (a->t1 - a->t0) * 1000);
    attempt_free(a);
}

int attempt_begin(const struct cfg *cfg, struct db *db, struct store_claim *c,
                  double claimed_mono, struct attempt **out)
{
    const struct cfg_provider *p = cfg_find_provider(cfg, c->provider, strlen(c->provider));
    const char *why = NULL;
    *out = NULL;
    if (c->born) {
        double before = clock_mono();
        if (begin_born(cfg, db, c) < 0)
            return -1;
        claimed_mono = before; /* the lease counts from the statement that moved it */
    }
    if (!p) {
        release_unsent(db, c, ST_PREPARED, "provider is not configured on this replica");
        return -1;
    }
    if (!pol_send_in_window(c->ambiguous_before, c->idem_header && *c->idem_header,
                            c->operator_absent, c->since_first_ms, p->recovery_window_ms)) {
        release_unsent(db, c, ST_UNKNOWN,
                       "an earlier attempt may have made the task and its recovery window has "
                       "passed: not sent again (the reconciler decides)");
        return -1;
    }
    char *secret = *c->credential ? secret_get(c->credential) : NULL;
    enum cw_verdict cred = cw_judge(c->credential, secret);
    secret_free(secret);
    if (cred != CW_USABLE) {
        release_unsent(db, c, ST_PREPARED, cw_reason(cred));
        return -1;
    }
    if (load_upload(cfg, p, db, c) < 0)
        return -1;
    struct attempt *a = calloc(1, sizeof(*a));
    if (!a) {
        release_unsent(db, c, ST_PREPARED, "out of memory");
        return -1;
    }
    if (build_outbound(cfg, p, c, &a->o, &why) < 0) {
        outbound_fini(&a->o);
        free(a);
        release_unsent(db, c, pol_unsendable(c->ambiguous_before), why);
        return -1;
    }
    a->p = p;
    a->c = *c;
    memset(c, 0, sizeof(*c)); /* the attempt owns the claim now */
    /* The whole call must fit in the lease: once it expires the reaper may hand the operation
     * to another worker, so the last moment to start sending leaves room for the provider's
     * total timeout. claimed_mono was taken before the claim, which only makes this earlier. */
    a->lease_end = claimed_mono + a->c.lease_remaining_s - LEASE_SEND_MARGIN_S;
    a->lease_seconds = cfg->lease_seconds;
    double mono_now = clock_mono(), wall_now = clock_wall();
    a->send_by = clock_deadline_in(a->lease_end - (double)p->total_timeout_ms / 1000.0 - mono_now,
                                   mono_now, wall_now);
    *out = a;
    return 0;
}

const struct cfg_provider *attempt_provider(const struct attempt *a)
{
    return a->p;
}

const char *attempt_job_id(const struct attempt *a)
{
    return a->c.id;
}

void attempt_abandon(struct attempt *a, struct db *db, const char *why)
{
    release_unsent(db, &a->c, ST_PREPARED, why);
    attempt_free(a);
}

int attempt_xfer(struct attempt *a, struct up_xfer **x, struct up_response *res)
{
    struct prov_call call = {.method = a->c.method,
                             .url = a->o.url,
                             .credential = a->c.credential,
                             .headers = a->o.hdrs,
                             .body = a->o.body ? a->o.body : (const char *)a->c.body,
                             .body_len = a->o.body ? a->o.body_len : a->c.body_len,
                             .before_send = lease_guard,
                             .before_send_arg = &a->send_by};
    /* Clients of this replica waiting for this stream read it as it arrives; and where the
     * provider keeps the generation (reconcile.task.path), the id its stream names is kept on
     * the row while the call goes on. */
    int streamed = a->p->stream_format && sse_requested(call.body, call.body_len);
    a->stream_sent = streamed;
    if (streamed && !a->ls)
        a->ls = ls_attach(a->c.id);
    a->id_looked_for = streamed && a->notes && a->p->task_path &&
                       a->p->mode != CFG_MODE_ASYNC_POLL;
    a->head_len = 0;
    a->head_id[0] = '\0';
    /* Every stream's record is kept in batches as it arrives (keep_partial). */
    a->partial_on = streamed && a->notes;
    /* A dispatcher's create (it has a writer for its notes) keeps its lease while it runs
     * (attempt_tick), and may then run up to the profile's create_total_ms. */
    if (a->notes && !a->keeper && strlen(a->c.id) < sizeof(a->keeper->id) &&
        (a->keeper = calloc(1, sizeof(*a->keeper)))) {
        struct keeper *k = a->keeper;
        atomic_init(&k->refs, 1);
        atomic_init(&k->end_ms, (long long)(a->lease_end * 1000.0));
        atomic_init(&k->pending, 0);
        atomic_init(&k->lost, 0);
        k->tenant_id = a->c.tenant_id;
        k->lease_version = a->c.lease_version;
        k->lease_seconds = a->lease_seconds;
        memcpy(k->id, a->c.id, strlen(a->c.id) + 1);
    }
    call.lease_kept = a->keeper != NULL;
    free(a->pend);
    a->pend = NULL;
    a->pend_len = a->pend_cap = a->noted = 0;
    a->noted_at = clock_mono();
    if (a->ls || a->id_looked_for || a->partial_on) {
        call.on_stream = on_stream;
        call.on_stream_arg = a;
    }
    /* Clients wait for it here: the live stream is the record, in bounded memory (it spools a
     * long one), and the transfer does not collect it a second time. */
    a->kept = call.stream_kept = a->ls != NULL;
    a->t0 = clock_wall();
    return prov_xfer_new(a->p, &call, x, res);
}

void attempt_end(struct attempt *a, struct db *db, struct up_response *res, double t1)
{
    const struct store_finish *f = attempt_outcome(a, db, res, t1);
    int applied = 0;
    int e = store_finish(db, f, &applied);
    attempt_recorded(a, e, applied);
}
