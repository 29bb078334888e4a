#include "idemgate/poller.h"
#include "idemgate/archplan.h"
#include "idemgate/clock.h"

#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/provider.h"
#include "idemgate/lease.h"
#include "idemgate/tmpl.h"
#include "idemgate/wpool.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IDLE_SLEEP_MS 100

int poller_status_of(const struct cfg_provider *p, int http_status, const cJSON *doc)
{
    if (p->status_by_http) {
        if (http_status == 200)
            return TS_SUCCEEDED;
        if (http_status == 202)
            return TS_RUNNING;
        /* Only a refusal about the task itself ends it; credentials, throttling and a task
         * not visible yet are read again later. */
        return http_status >= 400 && http_status < 500 && http_status != 401 &&
                       http_status != 403 && http_status != 404 && http_status != 408 &&
                       http_status != 429
                   ? TS_FAILED
                   : -1;
    }
    if (!doc)
        return -1;
    if (p->status_path) {
        const char *word = jpath_string(p->status_path, doc);
        return word ? prof_map_status(p, word) : -1;
    }
    const cJSON *done = jpath_first(p->done_path, doc);
    if (!cJSON_IsTrue(done))
        return TS_RUNNING; /* absent or false: not done yet */
    const cJSON *err = p->error_present_path ? jpath_first(p->error_present_path, doc) : NULL;
    return err && !cJSON_IsNull(err) ? TS_FAILED : TS_SUCCEEDED;
}

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

/* An authenticated call; never without the credential (a 401 would read as the task's
 * failure). */
static int call(const struct cfg_provider *p, const char *credential, const char *method,
                const char *url, const char *body, struct up_response *res)
{
    struct prov_call c = {.method = method,
                          .url = url,
                          .credential = credential,
                          .body = body,
                          .body_len = body ? strlen(body) : 0};
    return prov_call(p, &c, res);
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
    jpath_each(p->result_outputs, doc, add_output, &x);
    return x.n;
}

/* Writes a poll's conclusion under the poller's lease (state accepted → next). */
static void write_poll(struct db *db, const struct store_claim *c, enum op_state next,
                       long delay_ms, const char *status, const char *error,
                       const struct up_response *res, int outputs, const char *outputs_json,
                       double t0, const struct cfg_provider *p)
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
    f.started_at = t0;
    /* Completed: what the provider charges for the outputs it delivered. */
    int unpriced = 0;
    if (next == ST_COMPLETED && p && p->pricing.present)
        f.cost_micros = price_actual_raw(&p->pricing, (const char *)c->body, c->body_len,
                                         c->outputs_requested, outputs, NULL, &unpriced);
    int applied = 0;
    int e = store_finish(db, &f, &applied);
    if (e == STORE_OK && applied && f.cost_micros >= 0)
        metrics_spend(p->name, p->pricing.currency, f.cost_micros, unpriced);
    if (e == STORE_OK && !applied)
        metrics_safety(MS_FENCED_WRITE);
    if (e < 0 || !applied)
        LOG(LOG_WARN, "poll_write_dropped", LS("job_id", c->id), LS("status", status));
    else if (final)
        LOG(LOG_INFO, "polled_final", LS("job_id", c->id), LS("provider", c->provider),
            LS("state", st_name(next)), LS("status", status), LI("polls", c->polls));
}

/* The delay before the next status read: the profile's interval growing with the polls made,
 * capped, never under the provider's hint header. */
static long next_delay(const struct cfg_provider *p, const struct store_claim *c,
                       const struct up_response *res)
{
    long d = p->poll_interval_ms;
    for (int i = 1; i < c->polls && d < p->poll_max_interval_ms; i++)
        d += d / 2;
    if (d > p->poll_max_interval_ms)
        d = p->poll_max_interval_ms;
    if (p->poll_hint_header && res && res->headers_json) {
        cJSON *h = cJSON_Parse(res->headers_json);
        const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(h, p->poll_hint_header));
        long hint = v ? strtol(v, NULL, 10) : 0;
        if (hint > d)
            d = hint;
        cJSON_Delete(h);
    }
    return d;
}

static void send_cancel(const struct cfg_provider *p, const struct store_claim *c,
                        const struct vars *v)
{
    if (!p->cancel_path) {
        LOG(LOG_INFO, "cancel_unsupported", LS("job_id", c->id), LS("provider", p->name));
        return;
    }
    char *url = provider_url(p, p->cancel_path, v);
    struct up_response res;
    memset(&res, 0, sizeof(res));
    if (url)
        call(p, c->credential, p->cancel_method, url, NULL, &res);
    LOG(LOG_INFO, "cancel_sent", LS("job_id", c->id), LS("provider", p->name),
        LI("http_status", res.http_status));
    up_response_fini(&res);
    free(url);
}

/* The stored poll URL without suffix (a new string), or NULL when it does not end so. */
static char *strip_suffix(const char *url, const char *suffix)
{
    size_t n = url ? strlen(url) : 0, k = suffix ? strlen(suffix) : 0;
    if (!url || !suffix || n <= k || strcmp(url + n - k, suffix) != 0)
        return NULL;
    return strndup(url, n - k);
}

/* The outputs live elsewhere (fal's response_url): fetches them into *fetched. Returns the
 * status that follows: TS_SUCCEEDED, TS_FAILED for an error the result carries, or -1 when
 * there is no readable answer. */
static int fetch_result(const struct cfg_provider *p, const struct store_claim *c,
                        const struct vars *v, const cJSON *doc, struct up_response *fetched)
{
    const char *fu = p->result_fetch_url && doc ? jpath_string(p->result_fetch_url, doc) : NULL;
    char *furl = fu && prov_same_origin(fu, p->base_url) ? strdup(fu)
                 : p->result_fetch_path ? provider_url(p, p->result_fetch_path, v)
                                        : strip_suffix(c->poll_url, p->result_fetch_strip);
    int st = -1;
    if (furl && call(p, c->credential, "GET", furl, NULL, fetched) == 0 &&
        !fetched->body_truncated)
        st = fetched->http_status >= 400 && fetched->http_status < 500 ? TS_FAILED
             : fetched->http_status >= 300                                ? -1
                                                                         : TS_SUCCEEDED;
    free(furl);
    return st;
}

/* The state a task's end leads to: a task the provider cancelled after our cancel is canceled
 * (it existed, and may be billed); one it cancelled on its own, or that failed, is failed. */
static enum op_state ended_state(int st, int cancel_requested)
{
    return st == TS_CANCELED && cancel_requested ? ST_CANCELED : ST_FAILED;
}

/* Writes what status st shows: the outputs of a finished task (from final / fdoc, the answer
 * that carries the result), its failure or cancel, or another read later (res, the status
 * answer). A task that finished although the client cancelled says that the cancel came too
 * late: the result is kept, and paid. */
static void conclude(struct db *db, const struct cfg_provider *p, const struct store_claim *c,
                     int st, const struct up_response *final, const cJSON *fdoc,
                     const struct up_response *res, double t0)
{
    if (st == TS_SUCCEEDED) {
        cJSON *outs = cJSON_CreateArray();
        int n = poller_outputs(p, fdoc, c->remote_id, outs);
        char *oj = cJSON_PrintUnformatted(outs);
        write_poll(db, c, ST_COMPLETED, 0, "succeeded",
                   c->cancel_requested ? "the cancel came too late: the task finished at the "
                                         "provider (paid); its result is kept"
                                       : NULL,
                   final, n, oj, t0, p);
        free(oj);
        cJSON_Delete(outs);
    } else if (st == TS_FAILED || st == TS_CANCELED) {
        const char *msg = fdoc && p->result_error ? jpath_string(p->result_error, fdoc) : NULL;
        enum op_state next = ended_state(st, c->cancel_requested);
        char err[512];
        snprintf(err, sizeof(err), "%s: %s",
                 next == ST_CANCELED ? "canceled at the provider on our request"
                 : st == TS_CANCELED ? "canceled by the provider"
                                     : "task failed",
                 msg ? msg : "the provider gave no message");
        write_poll(db, c, next, 0, prof_status_name((enum task_status)st), err, final, -1, NULL,
                   t0, p);
    } else {
        /* Queued, running, or no readable answer: read again later. */
        write_poll(db, c, ST_ACCEPTED, next_delay(p, c, res),
                   st >= 0 ? prof_status_name((enum task_status)st) : "unreadable", NULL, res,
                   -1, NULL, t0, p);
    }
}

/* Reads the status of a claimed accepted operation (sending its cancel first when due) and
 * writes what it shows. */
static void poll_one(const struct cfg *cfg, struct db *db, struct store_claim *c,
                     double claimed_mono)
{
    (void)claimed_mono;
    double t0 = clock_wall();
    const struct cfg_provider *p = cfg_find_provider(cfg, c->provider, strlen(c->provider));
    if (!p || p->mode != CFG_MODE_ASYNC_POLL || !c->remote_id) {
        write_poll(db, c, ST_ACCEPTED, 60000, "not_configured",
                   "the provider is not configured for polling on this replica", NULL, -1, NULL,
                   t0, p);
        return;
    }
    struct vars v = {c->remote_id, c->id};
    if (c->cancel_due)
        send_cancel(p, c, &v);
    /* The poll URL the provider gave is used as stored; otherwise the profile's template. */
    char *url = c->poll_url ? strdup(c->poll_url) : provider_url(p, p->poll_path, &v);
    char *body = p->poll_body ? poll_body(p, &v) : NULL;
    struct up_response res, fetched;
    memset(&res, 0, sizeof(res));
    memset(&fetched, 0, sizeof(fetched));
    int rc = url ? call(p, c->credential, p->poll_method, url, body, &res) : -1;
    cJSON *doc = rc == 0 && res.body ? cJSON_ParseWithLength(res.body, res.body_len) : NULL;
    /* An answer over the profile's cap is not read as a status: never completed on part of it. */
    int st = rc == 0 && !res.body_truncated ? poller_status_of(p, res.http_status, doc) : -1;
    if (rc == 0 && !p->status_by_http && res.http_status >= 300)
        st = -1;
    const struct up_response *final = &res;
    cJSON *fdoc = doc;
    if (st == TS_SUCCEEDED &&
        (p->result_fetch_path || p->result_fetch_url || p->result_fetch_strip)) {
        st = fetch_result(p, c, &v, doc, &fetched);
        if (st >= 0) {
            final = &fetched;
            fdoc = fetched.body ? cJSON_ParseWithLength(fetched.body, fetched.body_len) : NULL;
        }
    }
    conclude(db, p, c, st, final, fdoc, &res, t0);
    if (fdoc != doc)
        cJSON_Delete(fdoc);
    cJSON_Delete(doc);
    up_response_fini(&fetched);
    up_response_fini(&res);
    free(body);
    free(url);
}

static const struct wpool_spec poll_pool = {
    .name = "poll",
    .claim = store_poll_claim,
    .work = poll_one,
    .idle_ms = IDLE_SLEEP_MS,
    .error_ms = IDLE_SLEEP_MS,
};

struct wpool *poller_start(const struct cfg *cfg)
{
    return wpool_start(cfg, cfg->poll_workers, &poll_pool);
}
