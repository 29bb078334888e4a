#include "idemgate/poller.h"

#include "idemgate/attempt.h"
#include "idemgate/archive.h"
#include "idemgate/archplan.h"
#include "idemgate/clock.h"
#include "idemgate/crash.h"
#include "idemgate/credwatch.h"
#include "idemgate/engine.h"

#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/provider.h"
#include "idemgate/resultq.h"
#include "idemgate/lease.h"
#include "idemgate/policy.h"
#include "idemgate/tmpl.h"
#include "idemgate/utf8.h"
#include "idemgate/wpool.h"

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IDLE_SLEEP_MS 100
/* Results one thread writes before it looks at anything else. */
#define RESULTS_PER_TURN 64
/* Margin kept between the last moment a cancel may start leaving and the poll's lease's end (as
 * attempt.c's LEASE_SEND_MARGIN_S for a create): clock rates, the request's way out. */
#define CANCEL_LEASE_MARGIN_S 1.0

struct vars {
    const char *id, *client_ref;
};

static const char *var(const char *name, size_t len, void *arg)
{
    const struct vars *v = arg;
    if (len == 2 && memcmp(name, "id", 2) == 0)
        return v->id;
    if (len == 10 && memcmp(name, "client_ref", 10) == 0)
        return v->client_ref;
    return NULL;
}

static char *provider_url(const struct cfg_provider *p, const char *tmpl, const struct vars *v)
{
    return prov_url(p, tmpl, var, (void *)v, "poll");
}

/* The poll body: the profile's JSON object with placeholders expanded inside its strings (built
 * with cJSON so a value can never break out of its string). */
static void expand_strings(cJSON *node, const struct vars *v)
{
    for (cJSON *c = node->child; c; c = c->next) {
        if (cJSON_IsString(c)) {
            char err[64], *out = NULL;
            if (tmpl_expand(c->valuestring, TMPL_RAW, var, (void *)v, &out, err, sizeof(err)) ==
                0) {
                cJSON_SetValuestring(c, out);
                free(out);
            }
        } else if (cJSON_IsObject(c) || cJSON_IsArray(c)) {
            expand_strings(c, v);
        }
    }
}

static char *poll_body(const struct cfg_provider *p, const struct vars *v)
{
    cJSON *b = cJSON_Parse(p->poll_body);
    if (!b)
        return NULL;
    expand_strings(b, v);
    char *s = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    return s;
}

struct out_ctx {
    const struct cfg_provider *p;
    cJSON *out;
    long long expires;
    int n;
};

/* One output: a string (a URL, or base64 data) or an object holding the URL. */
static void add_output(const cJSON *node, void *arg)
{
    struct out_ctx *x = arg;
    const char *v = cJSON_IsString(node) ? node->valuestring
                    : x->p->result_output_url ? jpath_string(x->p->result_output_url, node)
                                              : NULL;
    /* An object without a URL may carry the bytes themselves (Vertex: bytesBase64Encoded). */
    const char *b64 = !v && cJSON_IsObject(node) && x->p->archive && x->p->archive->b64
                          ? jpath_string(x->p->archive->b64, node)
                          : NULL;
    if (!v && !b64)
        return;
    if (b64)
        v = b64;
    cJSON *o = cJSON_CreateObject();
    if (b64 || !strcmp(x->p->result_kind, "b64")) {
        cJSON_AddStringToObject(o, "kind", "b64");
        cJSON_AddNumberToObject(o, "bytes", (double)(strlen(v) / 4 * 3));
    } else {
        cJSON_AddStringToObject(o, "url", v);
        cJSON_AddNumberToObject(o, "expires_at", (double)x->expires);
    }
    cJSON_AddItemToArray(x->out, o);
    x->n++;
}

int poller_outputs(const struct cfg_provider *p, const cJSON *doc, const char *remote_id,
                   cJSON *out)
{
    long long expires = (long long)time(NULL) + p->result_url_ttl_s;
    const cJSON *exp = doc && p->result_expires_at ? jpath_first(p->result_expires_at, doc) : NULL;
    /* A provider's expiry in Unix seconds; a value no clock holds (negative, past year 9999,
     * not finite) is not one: the profile's TTL stands. */
    if (cJSON_IsNumber(exp) && exp->valuedouble >= 0 && exp->valuedouble < 253402300800.0)
        expires = (long long)exp->valuedouble;
    if (!strcmp(p->result_kind, "binary_endpoint")) {
        struct vars v = {remote_id, NULL};
        char *url = provider_url(p, p->result_content_path, &v);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "url", url ? url : "");
        cJSON_AddNumberToObject(o, "expires_at", (double)expires);
        cJSON_AddItemToArray(out, o);
        free(url);
        return 1;
    }
    if (!doc || !p->result_outputs)
        return 0;
    struct out_ctx x = {p, out, expires, 0};
    jpath_each_list(p->result_outputs, doc, add_output, &x);
    return x.n;
}

/* Writes a poll's conclusion under the poller's lease (state accepted → next). */
static void write_poll_usage(struct db *db, const struct store_claim *c, enum op_state next,
                             long delay_ms, const char *status, const char *error,
                             const struct up_response *res, int outputs,
                             const char *outputs_json, const char *usage, double t0,
                             const struct cfg_provider *p)
{
    int final = next != ST_ACCEPTED;
    struct store_finish f;
    store_finish_init(&f, c, "poll", ST_ACCEPTED);
    store_finish_evidence(&f, res, final);
    f.state = next;
    f.outcome = status;
    f.error = error;
    f.retry_delay_ms = delay_ms;
    f.outputs_received = outputs;
    f.provider_status = status;
    f.outputs_json = outputs_json;
    f.usage = usage;
    f.started_at = t0;
    /* Completed: what the provider charges for the outputs it delivered (and the usage it
     * reported, for a synchronous create followed to its end). */
    int unpriced = 0;
    if (next == ST_COMPLETED && p && p->pricing.present &&
        price_currency_fits(&p->pricing, c->currency))
        f.cost_micros = price_actual_raw(&p->pricing, (const char *)c->body, c->body_len,
                                         c->outputs_requested, outputs, usage, &unpriced);
    /* A completed result is written with its outputs' archive plan (no second write). */
    char *plan = archive_plan_json(p, &f, c->remote_id, c->credential, NULL);
    f.archive_plan = plan;
    int applied = 0;
    int e = store_finish(db, &f, &applied);
    if (e == STORE_OK && applied && next == ST_COMPLETED)
        archive_plan_written(plan, c->id, p->name);
    free(plan);
    if (e == STORE_OK && applied && f.cost_micros >= 0)
        metrics_spend(p->name, p->pricing.currency, f.cost_micros, unpriced);
    /* since_first_ms is the claim's (database time); the poll took the rest. */
    if (e == STORE_OK && applied && next == ST_COMPLETED)
        metrics_job_seconds(c->provider, (double)c->since_first_ms / 1000 + (clock_wall() - t0));
    if (e == STORE_OK && !applied)
        metrics_safety(MS_FENCED_WRITE);
    if (e == STORE_OK && applied && next == ST_REVIEW)
        metrics_safety(MS_REVIEW_ENTERED);
    if (e < 0 || !applied)
        LOG(LOG_WARN, "poll_write_dropped", LS("job_id", c->id), LS("status", status));
    else if (final)
        LOG(LOG_INFO, "polled_final", LS("job_id", c->id), LS("provider", c->provider),
            LS("state", st_name(next)), LS("status", status), LI("polls", c->polls));
}

static void write_poll(struct db *db, const struct store_claim *c, enum op_state next,
                       long delay_ms, const char *status, const char *error,
                       const struct up_response *res, int outputs, const char *outputs_json,
                       double t0, const struct cfg_provider *p)
{
    write_poll_usage(db, c, next, delay_ms, status, error, res, outputs, outputs_json, NULL, t0,
                     p);
}

/* The delay before the next status read (pol_poll_delay_ms): the profile's interval growing with
 * the polls made, capped, never under the provider's hint header nor what the answer asked
 * (Retry-After and the other forms attempt_server_hint_ms reads). */
static long next_delay(const struct cfg_provider *p, const struct store_claim *c,
                       const struct up_response *res)
{
    long hint = -1;
    if (p->poll_hint_header && res && res->headers_json) {
        cJSON *h = cJSON_Parse(res->headers_json);
        const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(h, p->poll_hint_header));
        hint = v ? strtol(v, NULL, 10) : -1;
        cJSON_Delete(h);
    }
    long long server = res ? attempt_server_hint_ms(p, res) : -1;
    return pol_poll_delay_ms(p->poll_interval_ms, p->poll_max_interval_ms, c->polls, hint, server);
}

/* The stored poll URL without suffix (a new string), or NULL when it does not end so. */
static char *strip_suffix(const char *url, const char *suffix)
{
    size_t n = url ? strlen(url) : 0, k = suffix ? strlen(suffix) : 0;
    if (!url || !suffix || n <= k || strcmp(url + n - k, suffix) != 0)
        return NULL;
    return strndup(url, n - k);
}

/* Where the outputs live when elsewhere than the status answer (fal's response_url): a new
 * string, or NULL when the profile does not say or the URL cannot be made. The suffix is cut
 * from the URL the status was read at: the create's status URL, or — for a task found without
 * its create's answer (by an operator, a webhook) — the one the poll template made. */
static char *fetch_url(const struct cfg_provider *p, const char *polled, const struct vars *v,
                       const cJSON *doc)
{
    const char *fu = p->result_fetch_url && doc ? jpath_string(p->result_fetch_url, doc) : NULL;
    return fu && prov_same_origin(fu, p->base_url) ? strdup(fu)
           : p->result_fetch_path ? provider_url(p, p->result_fetch_path, v)
                                  : strip_suffix(polled, p->result_fetch_strip);
}

/* The state a task's end leads to: a task the provider cancelled after our cancel is canceled
 * (it existed, and may be billed); one it cancelled on its own, or that failed, is failed. */
static enum op_state ended_state(int st, int cancel_requested)
{
    return st == TS_CANCELED && cancel_requested ? ST_CANCELED : ST_FAILED;
}

/* Whether a finished task's answer holds none of the outputs asked for where the profile reads
 * them (outputs.requested counted, result.outputs read): its result is not where it was looked
 * for, and it is never completed as empty on that guess (as the reconciler's found_sync). Nor
 * when nothing was counted (a profile without outputs.requested: Runway, Luma) but the profile
 * reads its outputs (reads_outputs): a success with none there — a result not yet filled in, a
 * shape the profile does not know — is read again, then an operator's, never `completed` with
 * nothing to keep. */
static int outputs_missing(const struct store_claim *c, int received, int reads_outputs)
{
    return received == 0 && (c->outputs_requested > 0 ||
                             (c->outputs_requested < 0 && reads_outputs));
}

/* A read that does not end the task: read again later (accepted, after delay_ms), or, past the
 * job's poll deadline (c->poll_overdue), handed to an operator (review) with why. */
static void not_ended(struct db *db, const struct cfg_provider *p, const struct store_claim *c,
                      const char *status, const char *error, const struct up_response *res,
                      long delay_ms, double t0)
{
    if (!c->poll_overdue) {
        write_poll(db, c, ST_ACCEPTED, delay_ms, status, error, res, -1, NULL, t0, p);
        return;
    }
    char why[640];
    snprintf(why, sizeof(why),
             "the poll deadline (poll.deadline_seconds) passed before the task was seen to end "
             "(last read: %s%s%s); it may still run, and be billed: an operator resumes its "
             "polling (POST /v1/admin/jobs/{id}/resume) or resolves it",
             status, error ? ", " : "", error ? error : "");
    write_poll(db, c, ST_REVIEW, 0, "poll_deadline", why, res, -1, NULL, t0, p);
}

/* A task the provider says succeeded whose outputs are not where the profile reads them: the job
 * stays accepted and is read again (they may show a moment later), until its poll deadline,
 * where it goes to an operator (review). */
static void succeeded_without_outputs(struct db *db, const struct cfg_provider *p,
                                      const struct store_claim *c, const struct up_response *final,
                                      double t0)
{
    LOG(LOG_WARN, "succeeded_without_outputs", LS("job_id", c->id), LS("provider", p->name),
        LI("requested", c->outputs_requested));
    not_ended(db, p, c, "succeeded_without_outputs",
              "the task succeeded but none of its outputs is where the profile reads them "
              "(result.outputs)",
              final, next_delay(p, c, final), t0);
}

/* Writes what status st shows: the outputs of a finished task (from final / fdoc, the answer
 * that carries the result), its failure or cancel, or another read later (res, the status
 * answer). A task that finished although the client cancelled says that the cancel came too
 * late: the result is kept, and paid. */
static void conclude(struct db *db, const struct cfg_provider *p, const struct store_claim *c,
                     int st, const struct up_response *final, const cJSON *fdoc,
                     const struct up_response *res, double t0)
{
    if (st == TS_SUCCEEDED && p->mode != CFG_MODE_ASYNC_POLL) {
        /* A synchronous create followed to its end: the answer read is its result, as its
         * create's whole answer would have been — outputs, usage and cost read from it. */
        struct attempt_results rs;
        attempt_count_results(p, final, &rs);
        if (outputs_missing(c, rs.received, 0)) {
            free(rs.usage);
            succeeded_without_outputs(db, p, c, final, t0);
            return;
        }
        write_poll_usage(db, c, ST_COMPLETED, 0, "succeeded",
                         c->cancel_requested ? "the cancel came too late: the task finished at "
                                               "the provider (paid); its result is kept"
                                             : NULL,
                         final, rs.received, NULL, rs.usage, t0, p);
        free(rs.usage);
    } else if (st == TS_SUCCEEDED) {
        cJSON *outs = cJSON_CreateArray();
        int n = poller_outputs(p, fdoc, c->remote_id, outs);
        long withheld = n == 0 ? prof_outputs_withheld(p, fdoc, c->outputs_requested) : 0;
        if (!withheld && outputs_missing(c, n, p->result_outputs != NULL)) {
            cJSON_Delete(outs);
            succeeded_without_outputs(db, p, c, final, t0);
            return;
        }
        const char *note = c->cancel_requested ? "the cancel came too late: the task finished "
                                                 "at the provider (paid); its result is kept"
                                               : NULL;
        char why[160];
        if (withheld) { /* every output withheld (a safety filter): nothing to deliver */
            snprintf(why, sizeof(why),
                     "the provider withheld all %ld of the task's outputs (result.filtered: its "
                     "safety filter); none was delivered",
                     withheld);
            note = why;
        }
        char *oj = cJSON_PrintUnformatted(outs);
        write_poll(db, c, ST_COMPLETED, 0, "succeeded", note, final, n, oj, t0, p);
        free(oj);
        cJSON_Delete(outs);
    } else if (st == TS_FAILED || st == TS_CANCELED) {
        const char *msg = fdoc && p->result_error ? jpath_string(p->result_error, fdoc) : NULL;
        enum op_state next = ended_state(st, c->cancel_requested);
        char err[512];
        snprintf(err, sizeof(err), "%s: %s",
                 next == ST_CANCELED
                     ? (p->cancel_deletes
                            ? "canceled at the provider on our request (its cancel deletes the "
                              "task: had it finished just before, it may be billed)"
                            : "canceled at the provider on our request")
                 : st == TS_CANCELED ? "canceled by the provider"
                                     : "task failed",
                 msg ? msg : "the provider gave no message");
        utf8_trim_cut(err); /* a long message is cut at a byte count: never inside a character */
        write_poll(db, c, next, 0, prof_status_name((enum task_status)st), err, final, -1, NULL,
                   t0, p);
    } else {
        /* Queued, running, or no readable answer: read again later (review past the deadline). */
        not_ended(db, p, c, st >= 0 ? prof_status_name((enum task_status)st) : "unreadable",
                  NULL, res, next_delay(p, c, res), t0);
    }
}

/* One poll on the call engine: its cancel (when due: after a status read that shows the task
 * still running, pol_cancel_after_read), its status read and its result fetch (when the outputs
 * live elsewhere) are made one after the other by the engine's threads; the conclusion is
 * written by a poller thread, with its connection. */
enum poll_step { STEP_PRECHECK, STEP_CANCEL, STEP_STATUS, STEP_FETCH };

struct poll_job {
    struct rq_item node;
    struct poller *pl;
    const struct cfg_provider *p;
    struct store_claim c; /* owned */
    struct vars v;        /* into c */
    enum poll_step step;
    char *url, *body, *cancel_url, *furl;
    struct up_response res, fetched; /* the status answer; the fetched result */
    int st;                          /* the status concluded */
    int cancel_done; /* its cancel was answered for good, or cannot be sent: marked sent */
    int cancel_marked; /* ...and that is written */
    int cancel_status; /* the HTTP status its cancel was answered with (0: none sent) */
    struct clock_deadline cancel_by; /* the last moment its cancel may start leaving */
    double read_mono; /* when the read before its cancel was answered (monotonic) */
    double t0;
    double call_t0; /* wall clock when the current call was handed to the engine (0: none) */
};

struct poller {
    const struct cfg *cfg;
    struct credwatch *cw; /* the caller's */
    struct wpool *pool;
    struct eng *eng;
    struct rq *results;
    atomic_int starved; /* the last claim found the engine full */
};

/* The status read's method: the poll's, or GET for a task read by reconcile.task.path. */
static const char *poll_method(const struct cfg_provider *p)
{
    return p->mode == CFG_MODE_ASYNC_POLL ? p->poll_method : "GET";
}

static void job_free(struct poll_job *j)
{
    up_response_fini(&j->res);
    up_response_fini(&j->fetched);
    free(j->url);
    free(j->body);
    free(j->cancel_url);
    free(j->furl);
    store_claim_fini(&j->c);
    free(j);
}

static void on_end(void *arg, struct up_response *res);

/* Refuses a cancel once the poll's lease is (nearly) over, by this host's clocks: a poller frozen
 * between the read that showed the task running and its cancel (the process stopped, its thread
 * blocked) may wake when another replica owns the job and has read the task finished — a cancel
 * that deletes (Luma's, Runway's DELETE) would destroy the outputs of a completed job. */
static int cancel_guard(void *arg)
{
    const struct clock_deadline *by = arg;
    return clock_deadline_passed(by, clock_mono(), clock_wall()) ? -1 : 0;
}

/* Starts the job's next call on the engine. first: on the slot its claim took; otherwise a call
 * that follows one that ended keeps the job's place. A call that cannot even be made (no URL, a
 * missing credential) ends at once, with that evidence. */
static void start(struct poll_job *j, enum poll_step step, const char *method, const char *url,
                  const char *body, int first)
{
    struct prov_call call = {.method = method,
                             .url = url,
                             .credential = j->c.credential,
                             .body = body,
                             .body_len = body ? strlen(body) : 0};
    if (step == STEP_CANCEL) {
        call.before_send = cancel_guard;
        call.before_send_arg = &j->cancel_by;
    }
    struct up_xfer *x;
    struct up_response res;
    j->step = step;
    if (!url || prov_xfer_new(j->p, &call, &x, &res) < 0) {
        if (!url) {
            memset(&res, 0, sizeof(res));
            snprintf(res.error, sizeof(res.error), "no URL to read");
        }
        if (first)
            eng_release(j->pl->eng, -1);
        j->call_t0 = 0; /* no call was made: nothing to time */
        on_end(j, &res);
        return;
    }
    if (!first)
        eng_acquire_more(j->pl->eng);
    j->call_t0 = clock_wall();
    eng_submit(j->pl->eng, -1, x, on_end, j);
}

static int answered(const struct up_response *r)
{
    return r->curl_code == 0 && r->http_status > 0;
}

/* A call of the job ended (on an engine thread, or at once when it could not be made). A cancel
 * is followed by the status read (one answered for good is marked sent first, on a poller
 * thread); an answer goes to a poller thread, which reads it (nothing heavy runs here: a large
 * answer must not hold up the other calls of this engine thread). */
static void on_end(void *arg, struct up_response *res)
{
    struct poll_job *j = arg;
    const struct cfg_provider *p = j->p;
    if (j->call_t0 > 0)
        metrics_upstream_seconds(p->name, clock_wall() - j->call_t0);
    if (j->step == STEP_CANCEL && res->aborted_before_send) {
        /* Past the lease: nothing was sent, nothing here is written (fenced); the job's owner,
         * whoever it is now, reads the task before any cancel of its own. */
        LOG(LOG_WARN, "cancel_not_sent", LS("job_id", j->c.id), LS("provider", p->name),
            LS("note", res->curl_code || !res->error[0]
                           ? "the poll's lease was over (or, for a cancel that deletes, the read "
                             "showing the task running was over 2 s old) before the cancel could "
                             "leave: the next poll reads the task first"
                           : res->error));
        j->cancel_done = 0;
        j->cancel_status = 0;
    } else if (j->step == STEP_CANCEL) {
        j->cancel_done = pol_cancel_answered(res->curl_code, res->http_status);
        j->cancel_status = res->curl_code ? 0 : res->http_status;
        LOG(j->cancel_done ? LOG_INFO : LOG_WARN, "cancel_sent", LS("job_id", j->c.id),
            LS("provider", p->name), LI("http_status", res->http_status),
            LI("curl_code", res->curl_code),
            LS("note", j->cancel_done ? "answered" : "not answered for good: sent again next"));
    }
    if (j->step == STEP_CANCEL) {
        up_response_fini(res);
        if (j->cancel_done) { /* marked by a poller thread first: write_job */
            rq_push(j->pl->results, &j->node);
            return;
        }
        start(j, STEP_STATUS, poll_method(j->p), j->url, j->body, 0);
        return;
    }
    if (j->step == STEP_PRECHECK)
        j->read_mono = clock_mono();
    if (j->step == STEP_STATUS || j->step == STEP_PRECHECK)
        j->res = *res;
    else
        j->fetched = *res;
    rq_push(j->pl->results, &j->node);
}

/* The status a status read shows (-1: none readable); when the outputs are to be fetched from
 * elsewhere, j->furl is set (NULL: nowhere to read them, and the status is read again later). */
static int read_status(struct poll_job *j, const cJSON *doc)
{
    const struct cfg_provider *p = j->p;
    int ok = answered(&j->res);
    /* An answer over the profile's cap is not read as a status: never completed on part of it. */
    int st = ok && !j->res.body_truncated ? prof_task_status(p, j->res.http_status, doc) : -1;
    if (ok && !p->status_by_http && j->res.http_status >= 300)
        st = -1;
    if (st == TS_SUCCEEDED &&
        (p->result_fetch_path || p->result_fetch_url || p->result_fetch_strip)) {
        j->furl = fetch_url(p, j->url, &j->v, doc);
        if (!j->furl)
            st = -1; /* nowhere to read the result: the status is read again later */
    }
    return st;
}

/* Marks the job's cancel sent (answered for good, or never sendable) under the poll's claim. */
static void mark_cancel(struct db *db, struct poll_job *j)
{
    if (store_poll_cancel_sent(db, &j->c, j->cancel_status >= 200 && j->cancel_status < 300) ==
        STORE_OK)
        j->cancel_marked = 1;
    else
        LOG(LOG_WARN, "cancel_mark_failed", LS("job_id", j->c.id),
            LS("note", "the cancel will be sent again by the next poll"));
}

/* A poller thread reads what the job's answers show: the result is fetched when it lives
 * elsewhere, or the conclusion is written and the job freed. */
static void write_job(struct rq_item *it, struct db *db)
{
    struct poll_job *j = (struct poll_job *)it;
    if (j->step == STEP_CANCEL) {
        /* The cancel was answered for good: marked sent (acknowledged or not) before the read
         * that follows it, so that a replica dying during that read leaves the acknowledgement
         * on the row — a deleting cancel's task then reads 404 for good, which only the
         * acknowledgement lets the next poll read as canceled. */
        mark_cancel(db, j);
        CRASH_POINT("poll_after_cancel_mark");
        start(j, STEP_STATUS, poll_method(j->p), j->url, j->body, 0);
        return;
    }
    cJSON *doc = answered(&j->res) && j->res.body
                     ? cJSON_ParseWithLength(j->res.body, j->res.body_len)
                     : NULL;
    if (j->step == STEP_STATUS || j->step == STEP_PRECHECK) {
        metrics_poll_read(j->p->name, j->res.http_status, j->res.curl_code);
        j->st = read_status(j, doc);
        if (j->step == STEP_PRECHECK && pol_cancel_after_read(j->st)) {
            /* Still running: now the cancel, then the status read again. */
            cJSON_Delete(doc);
            up_response_fini(&j->res);
            memset(&j->res, 0, sizeof(j->res));
            free(j->furl);
            j->furl = NULL;
            CRASH_POINT("poll_before_cancel");
            double mono_now = clock_mono();
            double by = pol_cancel_by(j->p->cancel_deletes, j->cancel_by.mono, j->read_mono);
            if (by < j->cancel_by.mono)
                j->cancel_by = clock_deadline_in(by - mono_now, mono_now, clock_wall());
            start(j, STEP_CANCEL, j->p->cancel_method, j->cancel_url, NULL, 0);
            return;
        }
        /* The cancel this poll sent, or an earlier poll's that the provider acknowledged (the
         * read just after it failed: every later read answers 404). */
        int cancel_status = j->cancel_status ? j->cancel_status
                            : j->c.cancel_acknowledged ? 200
                                                       : 0;
        if (j->step == STEP_STATUS && j->st < 0 &&
            pol_deleted_by_cancel(j->p->cancel_deletes, cancel_status, j->res.curl_code,
                                  j->res.http_status))
            j->st = TS_CANCELED;
        if (j->st == TS_SUCCEEDED && j->furl) {
            cJSON_Delete(doc);
            start(j, STEP_FETCH, "GET", j->furl, NULL, 0);
            return;
        }
    } else {
        j->st = prov_fetched_status(j->p, &j->fetched);
    }
    if (j->cancel_done && !j->cancel_marked)
        mark_cancel(db, j);
    int fetched = j->step == STEP_FETCH && j->st >= 0;
    const struct up_response *final = fetched ? &j->fetched : &j->res;
    cJSON *fdoc = !fetched ? doc
                  : j->fetched.body ? cJSON_ParseWithLength(j->fetched.body, j->fetched.body_len)
                                    : NULL;
    conclude(db, j->p, &j->c, j->st, final, fdoc, &j->res, j->t0);
    if (fdoc != doc)
        cJSON_Delete(fdoc);
    cJSON_Delete(doc);
    job_free(j);
}

/* Starts the status read of a claimed accepted operation (its cancel first when due) on the
 * engine; the conclusion is written once the calls ended. */
static void poll_one(const struct cfg *cfg, struct db *db, struct store_claim *c,
                     double claimed_mono, void *arg)
{
    struct poller *pl = arg;
    double t0 = clock_wall();
    const struct cfg_provider *p = cfg_find_provider(cfg, c->provider, strlen(c->provider));
    struct poll_job *j = NULL;
    /* An async provider's task, or a synchronous create answered still in progress (a
     * background response: attempt_read_deferred), read by reconcile.task.path. */
    int deferred = p && p->mode != CFG_MODE_ASYNC_POLL && p->task_path && p->status_path;
    if (!p || (p->mode != CFG_MODE_ASYNC_POLL && !deferred) || !c->remote_id) {
        eng_release(pl->eng, -1);
        write_poll(db, c, ST_ACCEPTED, 60000, "not_configured",
                   "the provider is not configured for polling on this replica", NULL, -1, NULL,
                   t0, p);
        return;
    }
    if (!(j = calloc(1, sizeof(*j)))) {
        eng_release(pl->eng, -1);
        write_poll(db, c, ST_ACCEPTED, next_delay(p, c, NULL), "unreadable", "out of memory",
                   NULL, -1, NULL, t0, p);
        return;
    }
    j->pl = pl;
    j->p = p;
    j->c = *c;
    memset(c, 0, sizeof(*c)); /* the job owns the claim now */
    j->v = (struct vars){j->c.remote_id, j->c.id};
    j->t0 = t0;
    /* claimed_mono was taken before the claim, which only makes this earlier. */
    double mono_now = clock_mono();
    j->cancel_by = clock_deadline_in(claimed_mono + j->c.lease_remaining_s -
                                         CANCEL_LEASE_MARGIN_S - mono_now,
                                     mono_now, clock_wall());
    j->node.write = write_job;
    /* The poll URL the provider gave is used as stored; otherwise the profile's template. */
    j->url = j->c.poll_url ? strdup(j->c.poll_url)
                           : provider_url(p, deferred ? p->task_path : p->poll_path, &j->v);
    j->body = p->poll_body ? poll_body(p, &j->v) : NULL;
    if (j->c.cancel_due && !p->cancel_path) {
        LOG(LOG_INFO, "cancel_unsupported", LS("job_id", j->c.id), LS("provider", p->name));
        j->cancel_done = 1; /* nothing to send, ever */
    }
    if (j->c.cancel_due && p->cancel_path) {
        j->cancel_url = provider_url(p, p->cancel_path, &j->v);
        start(j, STEP_PRECHECK, poll_method(p), j->url, j->body, 1);
    } else {
        start(j, STEP_STATUS, poll_method(p), j->url, j->body, 1);
    }
}

/* Whether provider i is one this replica does not poll (cfg_providers_literal's skip): neither an
 * async profile nor a synchronous one whose answers in progress are read by reconcile.task.path
 * (poll_one's test), or one whose credential cannot be read here (left to the replicas that can:
 * each read here was unreadable, and an overdue job's sent it to review). */
static int not_polled(int i, void *arg)
{
    const struct poller *pl = arg;
    const struct cfg_provider *p = &pl->cfg->providers[i];
    return !(p->mode == CFG_MODE_ASYNC_POLL || (p->task_path && p->status_path)) ||
           !cw_sendable(pl->cw, i, clock_mono() * 1000);
}

/* Claims one accepted operation due for a read when the engine has room for its call. */
static int claim_with_room(struct db *db, const char *owner, int lease_seconds,
                           struct store_claim *out, void *arg)
{
    struct poller *pl = arg;
    char providers[8192];
    if (eng_room(pl->eng) <= 0) {
        atomic_store(&pl->starved, 1);
        return STORE_ENOTFOUND; /* full: a call's end wakes a thread to claim again */
    }
    atomic_store(&pl->starved, 0);
    /* Only the providers this replica polls: another replica's jobs are left to it (claimed
     * here, they were only written back "not configured" for a minute). */
    if (!cfg_providers_literal(pl->cfg, not_polled, pl, providers,
                               sizeof(providers)))
        return STORE_ENOTFOUND;
    /* The slot is taken once something was claimed (ENG_ROOM_THEN_TAKE in engine.h). */
    int e = store_poll_claim(db, owner, lease_seconds, providers, out);
    if (e == STORE_OK)
        eng_acquire_more(pl->eng);
    return e;
}

static int poll_starved(void *arg)
{
    return atomic_load(&((struct poller *)arg)->starved);
}

/* A slot was given back (by any pool's call): a claim that found the engine full is made again. */
static void poll_room(void *arg)
{
    struct poller *pl = arg;
    if (atomic_load(&pl->starved))
        rq_kick(pl->results);
}

static int write_results(struct db *db, void *arg)
{
    struct poller *pl = arg;
    return rq_run(pl->results, db, RESULTS_PER_TURN);
}

struct poller *poller_start(const struct cfg *cfg, struct eng *eng, struct credwatch *cw)
{
    struct poller *pl = calloc(1, sizeof(*pl));
    if (!pl)
        return NULL;
    pl->cfg = cfg;
    pl->cw = cw;
    pl->eng = eng;
    if (!(pl->results = rq_new())) {
        free(pl);
        return NULL;
    }
    struct wpool_spec spec = {.name = "poll",
                              .claim_arg = claim_with_room,
                              .work = poll_one,
                              .idle_ms = IDLE_SLEEP_MS,
                              .error_ms = IDLE_SLEEP_MS,
                              .arg = pl,
                              .chores = write_results,
                              .chores_fd = rq_fd(pl->results),
                              .starved = poll_starved};
    eng_on_room(eng, poll_room, pl);
    if (!(pl->pool = wpool_start(cfg, cfg->poll_workers, &spec))) {
        eng_room_off(eng, pl);
        rq_free(pl->results);
        free(pl);
        return NULL;
    }
    return pl;
}

void poller_quiesce(struct poller *pl)
{
    if (pl)
        wpool_quiesce(pl->pool);
}

void poller_stop(struct poller *pl)
{
    if (!pl)
        return;
    wpool_stop(pl->pool);
    eng_room_off(pl->eng, pl);
    rq_free(pl->results);
    free(pl);
}
