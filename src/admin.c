#include "idemgate/admin.h"

#include "idemgate/api.h"
#include "idemgate/archready.h"
#include "idemgate/archive.h"
#include "idemgate/crypto.h"
#include "idemgate/jobpage.h"
#include "idemgate/jobview.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/outputs.h"
#include "idemgate/migrate.h"
#include "idemgate/reply.h"
#include "idemgate/stmthealth.h"
#include "idemgate/store.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The admin token; answers 401 and returns 0 when absent. With no admin token configured the
 * admin API is off, and the 401 says so and how to turn it on: a caller cannot tell a wrong token
 * from a switched-off API otherwise. */
static int admin_ok(struct hs_req *r)
{
    if (reply_is_admin(r))
        return 1;
    if (!*api_cfg(r)->admin_token_sha256)
        reply_problem(r, 401, "unauthorized", "Unauthorized",
                      "the admin API is off: no admin token is configured. To turn it on, set "
                      "admin_token_sha256 in the configuration file (or the environment variable "
                      "IDEMGATE_ADMIN_TOKEN_SHA256) to the hex SHA-256 of a secret token, e.g. "
                      "`printf %s \"$ADMIN_TOKEN\" | sha256sum`, restart the gateway, and send "
                      "`Authorization: Bearer <that token>`",
                      0);
    else
        reply_problem(r, 401, "unauthorized", "Unauthorized",
                      "the admin token is required: `Authorization: Bearer <admin token>`, the "
                      "token whose SHA-256 is admin_token_sha256",
                      0);
    return 0;
}

/* POST /v1/admin/jobs/{id}/resume: polling of a job its poll deadline sent to review (or of an
 * accepted one) starts again, for one more hour. */
void admin_resume(struct hs_req *r, const struct api_args *a)
{
    char job_id[64];
    if (api_arg(a, 0, job_id, sizeof(job_id)) < 0) {
        reply_problem(r, 404, "not-found", "Not found", "no such endpoint", 0);
        return;
    }
    if (!admin_ok(r))
        return;
    int e = store_resume_polling(api_db(r), job_id, 3600L * 1000);
    if (e == STORE_ENOTFOUND)
        reply_problem(r, 404, "job-not-found", "Job not found", "no accepted job, nor one its poll deadline sent to review, with this id", 0);
    else if (e < 0)
        reply_store_error(r, e);
    else
        hs_respond(r, 200, "application/json", "{\"resumed\":true}", 16, NULL);
}

/* POST /v1/admin/providers/{p}/reset: clears a tripped provider credential. */
void admin_reset(struct hs_req *r, const struct api_args *a)
{
    char provider[64];
    if (api_arg(a, 0, provider, sizeof(provider)) < 0) {
        reply_problem(r, 404, "not-found", "Not found", "no such endpoint", 0);
        return;
    }
    const struct cfg *cfg = api_cfg(r);
    if (!admin_ok(r))
        return;
    if (!cfg_find_provider(cfg, provider, strlen(provider))) {
        reply_problem(r, 404, "unknown-provider", "Unknown provider", provider, 0);
        return;
    }
    int cleared = 0;
    int e = store_breaker_reset(api_db(r), provider, &cleared);
    if (e < 0) {
        reply_store_error(r, e);
        return;
    }
    LOG(LOG_WARN, "provider_reset", LS("provider", provider), LI("cleared", cleared),
        LS("request_id", hs_req_id(r)));
    char body[192];
    int n = snprintf(body, sizeof(body), "{\"provider\":\"%s\",\"cleared\":%s}", provider,
                     cleared ? "true" : "false");
    hs_respond(r, 200, "application/json", body, (size_t)n, NULL);
}

/* A page being built: the jobs up to the limit, whether one more came, and the cursor after the
 * last one kept. */
struct admin_page {
    cJSON *arr;
    int limit, n, has_more;
    size_t bytes; /* of the result bodies in the page */
    char cursor[JOBPAGE_CURSOR_LEN];
};

static void add_job(const struct store_job *j, void *arg)
{
    struct admin_page *p = arg;
    if (p->has_more || jobpage_past(p->n, p->limit, p->bytes)) { /* past the page: more */
        p->has_more = 1;
        return;
    }
    p->n++;
    p->bytes += j->resp_body_len;
    char *json = jobview_json(j);
    if (json) {
        cJSON_AddItemToArray(p->arr, cJSON_CreateRaw(json));
        free(json);
    }
    if (jobpage_cursor(j->created_at, j->id, p->cursor) < 0)
        p->cursor[0] = '\0';
}

static const char *const admin_jobs_params[] = {
    "state", "provider", "tenant", "idempotency_key", "limit", "starting_after", NULL};

/* 1 when v is absent or 1..max characters. */
static int len_ok(const char *v, size_t max)
{
    return !v || (*v && strlen(v) <= max);
}

/* GET /v1/admin/jobs?state=&provider=&tenant=&idempotency_key=&limit=&starting_after=: every
 * tenant's jobs, newest first, a page at a time (jobpage.h's cursor), each with its tenant's
 * name. An unknown or repeated parameter is a 400 that names it. */
void admin_jobs_list(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    if (!admin_ok(r))
        return;
    int repeated;
    const char *bad = hs_req_query_check(r, admin_jobs_params, &repeated);
    char detail[256];
    if (bad) {
        snprintf(detail, sizeof(detail),
                 repeated ? "query parameter \"%.64s\" is given twice"
                          : "unknown query parameter \"%.64s\": GET /v1/admin/jobs takes state, "
                            "provider, tenant, idempotency_key, limit and starting_after",
                 bad);
        reply_problem(r, 400, "invalid-query", "Invalid query", detail, 0);
        return;
    }
    struct store_admin_jobs_query q = {
        .state = hs_req_query(r, "state"),
        .provider = hs_req_query(r, "provider"),
        .tenant = hs_req_query(r, "tenant"),
        .key = hs_req_query(r, "idempotency_key"),
    };
    const char *lim = hs_req_query(r, "limit"), *after = hs_req_query(r, "starting_after");
    char *end = NULL;
    long limit = lim ? strtol(lim, &end, 10) : 100;
    char stamp[28], id[65];
    if ((q.state && st_parse(q.state) < 0) || !len_ok(q.provider, 64) || !len_ok(q.tenant, 64) ||
        !len_ok(q.key, 255) || (lim && (end == lim || *end || *lim < '0' || *lim > '9')) ||
        limit < 1 || limit > 1000 || (after && jobpage_cursor_parse(after, stamp, id) < 0)) {
        reply_problem(r, 400, "invalid-query", "Invalid query",
                      "state must be a job state, provider and tenant 1..64 characters, "
                      "idempotency_key 1..255, limit within 1..1000 and starting_after the "
                      "next_cursor of an earlier page",
                      0);
        return;
    }
    if (after) {
        q.before_at = stamp;
        q.before_id = id;
    }
    q.limit = (int)limit + 1; /* one row more than the page: whether another follows */
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    struct admin_page page = {.arr = cJSON_AddArrayToObject(o, "data"), .limit = (int)limit};
    int e = store_admin_jobs_page(api_db(r), &q, add_job, &page);
    if (e < 0) {
        cJSON_Delete(o);
        reply_store_error(r, e);
        return;
    }
    cJSON_AddBoolToObject(o, "has_more", page.has_more);
    if (page.has_more && page.cursor[0])
        cJSON_AddStringToObject(o, "next_cursor", page.cursor);
    else
        cJSON_AddNullToObject(o, "next_cursor");
    reply_json(r, 200, o);
}

/* A decimal text of the overview (NULL: null) as a JSON number. */
static void add_num(cJSON *o, const char *k, const char *v)
{
    if (v)
        cJSON_AddNumberToObject(o, k, strtod(v, NULL));
    else
        cJSON_AddNullToObject(o, k);
}

/* Micro-units as text (null stays null): exact where a double would round. */
static void add_micros(cJSON *o, const char *k, const char *v)
{
    if (!v) {
        cJSON_AddNullToObject(o, k);
        return;
    }
    long long m = strtoll(v, NULL, 10);
    char buf[40];
    snprintf(buf, sizeof(buf), "%s%lld.%06lld", m < 0 ? "-" : "", (m < 0 ? -m : m) / 1000000,
             (m < 0 ? -m : m) % 1000000);
    cJSON_AddItemToObject(o, k, cJSON_CreateRaw(v)); /* an integer: printed as the database did */
    char name[48];
    snprintf(name, sizeof(name), "%.*s", (int)(strlen(k) - 7), k); /* "cost_micros" → "cost" */
    cJSON_AddStringToObject(o, name, buf);
}

/* Unix seconds (decimal text) as an RFC 3339 UTC stamp; null when absent. */
static void add_stamp(cJSON *o, const char *k, const char *epoch)
{
    char out[STORE_STAMP_LEN];
    if (epoch && store_stamp_epoch(epoch, out) == 0)
        cJSON_AddStringToObject(o, k, out);
    else
        cJSON_AddNullToObject(o, k);
}

struct overview {
    cJSON *doubt, *by_state, *by_hour, *spend, *budgets, *times;
};

static void add_overview_row(const struct store_overview_row *w, void *arg)
{
    struct overview *v = arg;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return;
    if (!strcmp(w->kind, "doubt")) {
        cJSON_AddNumberToObject(o, "count", (double)w->n);
        if (w->sub)
            cJSON_AddStringToObject(o, "oldest_job", w->sub);
        else
            cJSON_AddNullToObject(o, "oldest_job");
        add_stamp(o, "oldest_since", w->b);
        if (w->a)
            cJSON_AddNumberToObject(o, "oldest_age_seconds", (double)(long long)strtod(w->a, NULL));
        else
            cJSON_AddNullToObject(o, "oldest_age_seconds");
        cJSON_AddItemToObject(v->doubt, w->name ? w->name : "", o);
    } else if (!strcmp(w->kind, "hour")) {
        add_stamp(o, "hour", w->a);
        cJSON_AddStringToObject(o, "state", w->name ? w->name : "");
        cJSON_AddNumberToObject(o, "count", (double)w->n);
        cJSON_AddItemToArray(v->by_hour, o);
        cJSON *total = cJSON_GetObjectItemCaseSensitive(v->by_state, w->name ? w->name : "");
        if (total)
            cJSON_SetNumberValue(total, total->valuedouble + (double)w->n);
    } else if (!strcmp(w->kind, "spend")) {
        char day[STORE_STAMP_LEN];
        cJSON_AddStringToObject(o, "tenant", w->tenant ? w->tenant : "");
        if (w->b && store_stamp_epoch(w->b, day) == 0) {
            day[10] = '\0';
            cJSON_AddStringToObject(o, "day", day);
        }
        cJSON_AddStringToObject(o, "provider", w->name ? w->name : "");
        /* The model as the request wrote it: a JSON string token, read back by cJSON. */
        cJSON *model = w->sub ? cJSON_Parse(w->sub) : NULL;
        if (cJSON_IsString(model))
            cJSON_AddStringToObject(o, "model", model->valuestring);
        else
            cJSON_AddNullToObject(o, "model");
        cJSON_Delete(model);
        cJSON_AddStringToObject(o, "currency", w->currency ? w->currency : "");
        cJSON_AddNumberToObject(o, "jobs", (double)w->n);
        add_micros(o, "cost_micros", w->a);
        cJSON_AddItemToArray(v->spend, o);
    } else if (!strcmp(w->kind, "time")) {
        cJSON_AddStringToObject(o, "provider", w->name ? w->name : "");
        cJSON_AddNumberToObject(o, "jobs", (double)w->n);
        add_num(o, "p50_seconds", w->a);
        add_num(o, "p95_seconds", w->b);
        cJSON_AddItemToArray(v->times, o);
    } else if (!strcmp(w->kind, "budget")) {
        cJSON_AddStringToObject(o, "tenant", w->tenant ? w->tenant : "");
        cJSON_AddStringToObject(o, "currency", w->currency ? w->currency : "");
        add_micros(o, "day_limit_micros", w->a);
        add_micros(o, "month_limit_micros", w->b);
        add_micros(o, "day_used_micros", w->c);
        add_micros(o, "month_used_micros", w->d);
        cJSON_AddItemToArray(v->budgets, o);
    } else {
        cJSON_Delete(o);
    }
}

/* GET /v1/admin/overview: what an operator watches, read from the database in one statement
 * (store_admin_overview: each part bounded by a backlog or a window): the jobs in doubt
 * (unknown, review: count and the oldest), the jobs created in the last 24 h by state (and by
 * hour), the spend of the last 30 UTC days by tenant, day, provider and model with the budgets,
 * and the time to complete per provider over 24 h (p50, p95). */
void admin_overview(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    if (!admin_ok(r))
        return;
    int repeated;
    static const char *const none[] = {NULL};
    if (hs_req_query_check(r, none, &repeated)) {
        reply_problem(r, 400, "invalid-query", "Invalid query",
                      "GET /v1/admin/overview takes no query parameter", 0);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "overview");
    struct overview v;
    v.doubt = cJSON_AddObjectToObject(o, "in_doubt");
    cJSON *jobs = cJSON_AddObjectToObject(o, "jobs_24h");
    v.by_state = cJSON_AddObjectToObject(jobs, "by_state");
    for (int s = 0; s < ST__COUNT; s++)
        cJSON_AddNumberToObject(v.by_state, st_name((enum op_state)s), 0);
    v.by_hour = cJSON_AddArrayToObject(jobs, "by_hour");
    cJSON *spend = cJSON_AddObjectToObject(o, "spend_30d");
    v.spend = cJSON_AddArrayToObject(spend, "data");
    v.budgets = cJSON_AddArrayToObject(spend, "budgets");
    v.times = cJSON_AddArrayToObject(o, "time_to_complete_24h");
    int e = store_admin_overview(api_db(r), add_overview_row, &v);
    if (e < 0) {
        cJSON_Delete(o);
        reply_store_error(r, e);
        return;
    }
    reply_json(r, 200, o);
}

/* GET /v1/admin/jobs/{id}/outputs/{n}: any tenant's archived output, as its tenant reads it. */
void admin_job_output(struct hs_req *r, const struct api_args *a)
{
    if (!admin_ok(r))
        return;
    outputs_get_any(r, a);
}

static void add_attempt(const struct store_attempt *at, void *arg)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "seq", (double)at->seq);
    cJSON_AddStringToObject(o, "kind", at->kind ? at->kind : "");
    cJSON_AddStringToObject(o, "outcome", at->outcome ? at->outcome : "");
    if (at->http_status)
        cJSON_AddNumberToObject(o, "http_status", at->http_status);
    else
        cJSON_AddNullToObject(o, "http_status");
    if (at->bytes_sent >= 0)
        cJSON_AddNumberToObject(o, "bytes_sent", (double)at->bytes_sent);
    else
        cJSON_AddNullToObject(o, "bytes_sent");
    cJSON_AddStringToObject(o, "decision", at->decision ? at->decision : "");
    cJSON_AddNumberToObject(o, "lease_version", (double)at->lease_version);
    if (at->started_at)
        cJSON_AddStringToObject(o, "started_at", at->started_at);
    else
        cJSON_AddNullToObject(o, "started_at");
    cJSON_AddStringToObject(o, "finished_at", at->finished_at ? at->finished_at : "");
    if (at->error)
        cJSON_AddStringToObject(o, "error", at->error);
    else
        cJSON_AddNullToObject(o, "error");
    cJSON_AddItemToArray(arg, o);
}

/* GET /v1/admin/jobs/{id}: any tenant's job with its attempt timeline. */
void admin_job_get(struct hs_req *r, const struct api_args *a)
{
    char id[CRYPTO_JOB_ID_LEN + 8];
    if (!admin_ok(r))
        return;
    struct store_job j;
    int e = api_arg(a, 0, id, sizeof(id)) <= 0 ? STORE_ENOTFOUND
                                               : store_admin_job_get(api_db(r), id, &j);
    if (e == STORE_ENOTFOUND) {
        reply_problem(r, 404, "job-not-found", "Job not found", "no job with this id", 0);
        return;
    }
    if (e < 0) {
        reply_store_error(r, e);
        return;
    }
    if (j.state == ST_COMPLETED &&
        archive_job_outputs(api_db(r), j.tenant_id, j.id, &j.archive, &j.archive_settled) < 0)
        j.archive = NULL; /* the job is still answered, without its archive */
    char *json = jobview_json(&j);
    if (!json) {
        store_job_fini(&j);
        reply_problem(r, 500, "internal", "Internal error", "out of memory", 0);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "admin_job");
    cJSON_AddItemToObject(o, "job", cJSON_CreateRaw(json));
    free(json);
    /* A second statement: an attempt recorded between the two reads shows up with the job as it
     * was just before, which the next read of the console puts right. */
    cJSON *timeline = cJSON_AddArrayToObject(o, "attempts");
    e = store_job_attempts(api_db(r), j.tenant_id, j.id, add_attempt, timeline);
    store_job_fini(&j);
    if (e < 0) {
        cJSON_Delete(o);
        reply_store_error(r, e);
        return;
    }
    reply_json(r, 200, o);
}

static void keep_breaker(const char *provider, int status, const char *reason,
                         const char *tripped_at, void *arg)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddNumberToObject(b, "http_status", status);
    cJSON_AddStringToObject(b, "reason", reason);
    cJSON_AddStringToObject(b, "tripped_at", tripped_at);
    cJSON_AddItemToObject(arg, provider, b);
}

/* GET /v1/admin/providers: every configured provider and its credential breaker. */
void admin_providers(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    const struct cfg *cfg = api_cfg(r);
    if (!admin_ok(r))
        return;
    cJSON *tripped = cJSON_CreateObject();
    int e = store_breaker_list(api_db(r), keep_breaker, tripped);
    if (e < 0) {
        cJSON_Delete(tripped);
        reply_store_error(r, e);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    for (size_t i = 0; i < cfg->n_providers; i++) {
        const struct cfg_provider *p = &cfg->providers[i];
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(tripped, p->name);
        cJSON *item = cJSON_CreateObject();
        cJSON_AddStringToObject(item, "name", p->name);
        cJSON_AddStringToObject(item, "mode",
                                p->mode == CFG_MODE_ASYNC_POLL ? "async_poll" : "sync");
        cJSON_AddBoolToObject(item, "tripped", b != NULL);
        if (b) {
            cJSON_AddItemToObject(item, "http_status",
                                  cJSON_Duplicate(cJSON_GetObjectItem(b, "http_status"), 1));
            cJSON_AddItemToObject(item, "reason",
                                  cJSON_Duplicate(cJSON_GetObjectItem(b, "reason"), 1));
            cJSON_AddItemToObject(item, "tripped_at",
                                  cJSON_Duplicate(cJSON_GetObjectItem(b, "tripped_at"), 1));
        } else {
            cJSON_AddNullToObject(item, "http_status");
            cJSON_AddNullToObject(item, "reason");
            cJSON_AddNullToObject(item, "tripped_at");
        }
        cJSON_AddItemToArray(data, item);
    }
    cJSON_Delete(tripped);
    reply_json(r, 200, o);
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

/* A statement the database refuses to run (stmthealth.h): {statement, sqlstate, seconds ago}. */
static void add_failing(const char *stmt, const char *sqlstate, double age_s, void *arg)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return;
    cJSON_AddStringToObject(o, "statement", stmt);
    cJSON_AddStringToObject(o, "sqlstate", sqlstate);
    cJSON_AddNumberToObject(o, "seconds_ago", (double)(long long)age_s);
    cJSON_AddItemToArray((cJSON *)arg, o);
}

/* Ready: the database answers, the schema is the one this binary expects, no statement is
 * refused by the database (stmthealth.h), and the archive can take copies when this replica makes
 * them (archready.h: probed at most every 5 s). A tripped provider credential is reported but
 * does not make the replica unready: the other providers work. */
static int token_is(struct hs_req *r, const char *sha256_hex);

static void ready_answer(struct hs_req *r, int detailed)
{
    int version = 0;
    int e = store_schema_version(api_db(r), &version);
    /* A newer schema is fine: migrations are additive, so a replica of the previous release
     * stays ready while a rollout migrates ahead of it. */
    int ready = e == STORE_OK && version >= migrate_latest() && !migrate_changed();
    char why[256] = "";
    enum archready_state arch = archready_check(api_cfg(r), why, sizeof(why));
    cJSON *o = cJSON_CreateObject();
    cJSON *ready_item = cJSON_AddBoolToObject(o, "ready", 0);
    cJSON_AddBoolToObject(o, "database", e == STORE_OK);
    cJSON_AddNumberToObject(o, "schema_version", version);
    cJSON_AddNumberToObject(o, "schema_expected", migrate_latest());
    if (migrate_changed()) /* an applied migration's text differs from this binary's */
        cJSON_AddNumberToObject(o, "migration_changed", migrate_changed());
    cJSON_AddStringToObject(o, "archive",
                            arch == ARCHREADY_NOT_USED   ? "not_used"
                            : arch == ARCHREADY_WRITABLE ? "writable"
                                                         : "unwritable");
    if (arch == ARCHREADY_UNWRITABLE) {
        cJSON_AddStringToObject(o, "archive_error", why);
        ready = 0;
    }
    /* Undetailed, the lists are read all the same (a failing statement is unready) and left out
     * of the answer. */
    cJSON *failing = cJSON_CreateArray(), *tripped = cJSON_CreateArray();
    if (sh_failing(add_failing, failing) > 0)
        ready = 0;
    if (ready)
        ready = store_breaker_list(api_db(r), add_breaker, tripped) == STORE_OK;
    if (detailed) {
        cJSON_AddItemToObject(o, "failing_statements", failing);
        cJSON_AddItemToObject(o, "tripped_providers", tripped);
    } else {
        cJSON_Delete(failing);
        cJSON_Delete(tripped);
    }
    ready_item->type = ready ? cJSON_True : cJSON_False;
    reply_json(r, ready ? 200 : 503, o);
}

/* Whether /readyz names the tripped providers and failing statements: to whoever may read
 * /metrics where it answers. With a metrics token, to it and the admin token only (before, the
 * metrics listener's /readyz told them to anyone beside a /metrics that refused them). */
static int ready_detailed(struct hs_req *r, int metrics_listener)
{
    const struct cfg *cfg = api_cfg(r);
    if (token_is(r, cfg->admin_token_sha256))
        return 1;
    if (!metrics_listener && *cfg->metrics_listen_host) /* the API's, metrics elsewhere */
        return 0;
    return !*cfg->metrics_token_sha256 || token_is(r, cfg->metrics_token_sha256);
}

void admin_ready_serve(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    ready_answer(r, ready_detailed(r, 1));
}

/* On the API's listener once metrics have their own (metrics_listen): the answer without which
 * providers are tripped and which statements fail — what that listener keeps from whoever can
 * reach the API, as it keeps /metrics — but to the admin token. */
void admin_ready(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    ready_answer(r, ready_detailed(r, 0));
}

/* What store_gauges read, kept until every family can be printed whole: the database answers
 * its figures in one order, the exposition needs each family's samples together. */
#define GAUGE_STATES 8
#define GAUGE_TRIPPED 64
struct gauge_read {
    char state[GAUGE_STATES][16];
    double state_n[GAUGE_STATES];
    int n_states;
    char *tripped[GAUGE_TRIPPED]; /* owned */
    int n_tripped;
    double budget[2]; /* day, month; -1: not read */
    double archive_pending, archive_oldest_s; /* -1: not read */
};

static void add_gauge(const char *kind, const char *name, double value, void *arg)
{
    struct gauge_read *g = arg;
    if (!strcmp(kind, "state") && g->n_states < GAUGE_STATES) {
        snprintf(g->state[g->n_states], sizeof(g->state[0]), "%s", name);
        g->state_n[g->n_states++] = value;
    } else if (!strcmp(kind, "tripped") && g->n_tripped < GAUGE_TRIPPED) {
        if ((g->tripped[g->n_tripped] = strdup(name)))
            g->n_tripped++;
    } else if (!strcmp(kind, "budget")) {
        g->budget[strcmp(name, "day") == 0 ? 0 : 1] = value;
    } else if (!strcmp(kind, "archive")) {
        if (!strcmp(name, "pending"))
            g->archive_pending = value;
        else
            g->archive_oldest_s = value;
    }
}

/* Whether the database named provider tripped. */
static int gauge_tripped(const struct gauge_read *g, const char *provider)
{
    for (int i = 0; i < g->n_tripped; i++)
        if (!strcmp(g->tripped[i], provider))
            return 1;
    return 0;
}

/* The database's families, each whole under its one # HELP and # TYPE (a family split in two is
 * read by a standard parser as a second, untyped one). db_ok: store_gauges answered; without it
 * only idemgate_database_up and what the configuration knows are printed. */
static void render_gauges(FILE *f, const struct cfg *cfg, const struct gauge_read *g, int db_ok)
{
    if (db_ok) {
        fputs("# HELP idemgate_operations Operations by state (the terminal ones counted at most "
              "once a minute).\n# TYPE idemgate_operations gauge\n",
              f);
        double review = 0;
        for (int i = 0; i < g->n_states; i++) {
            fprintf(f, "idemgate_operations{state=\"%s\"} %.0f\n", g->state[i], g->state_n[i]);
            if (!strcmp(g->state[i], "review"))
                review = g->state_n[i];
        }
        fprintf(f,
                "# HELP idemgate_review_backlog Operations waiting for an operator.\n"
                "# TYPE idemgate_review_backlog gauge\nidemgate_review_backlog %.0f\n",
                review);
        /* Every configured provider, 0 or 1; a provider tripped by another replica's
         * configuration is shown too (1). */
        fputs("# HELP idemgate_provider_tripped A provider whose credential the provider refused "
              "(1): nothing is sent to it until an operator resets it.\n"
              "# TYPE idemgate_provider_tripped gauge\n",
              f);
        for (size_t i = 0; i < cfg->n_providers; i++)
            fprintf(f, "idemgate_provider_tripped{provider=\"%s\"} %d\n", cfg->providers[i].name,
                    gauge_tripped(g, cfg->providers[i].name));
        for (int i = 0; i < g->n_tripped; i++)
            if (!cfg_find_provider(cfg, g->tripped[i], strlen(g->tripped[i])))
                fprintf(f, "idemgate_provider_tripped{provider=\"%s\"} 1\n", g->tripped[i]);
    }
    fprintf(f,
            "# HELP idemgate_database_up The database answered this scrape.\n"
            "# TYPE idemgate_database_up gauge\nidemgate_database_up %d\n"
            "# HELP idemgate_providers_configured Providers in the configuration.\n"
            "# TYPE idemgate_providers_configured gauge\n"
            "idemgate_providers_configured %zu\n",
            db_ok, cfg->n_providers);
    if (db_ok && g->budget[0] >= 0 && g->budget[1] >= 0)
        fprintf(f,
                "# HELP idemgate_budget_used_ratio The largest share of its amount limit any "
                "tenant with a budget has used (settled and reserved) this UTC day or month, "
                "0..1 (read at most once a minute).\n"
                "# TYPE idemgate_budget_used_ratio gauge\n"
                "idemgate_budget_used_ratio{period=\"day\"} %.6f\n"
                "idemgate_budget_used_ratio{period=\"month\"} %.6f\n",
                g->budget[0], g->budget[1]);
    if (db_ok && g->archive_pending >= 0 && g->archive_oldest_s >= 0)
        fprintf(f,
                "# HELP idemgate_archive_pending_copies Outputs whose archive copy is still to be "
                "made, by every replica, a completed job whose outputs are not planned yet "
                "counting as one (read at most once a minute).\n"
                "# TYPE idemgate_archive_pending_copies gauge\n"
                "idemgate_archive_pending_copies %.0f\n"
                "# HELP idemgate_archive_oldest_pending_seconds Age of the oldest output whose "
                "archive copy is still to be made (of a job not planned yet: since its end), 0 "
                "with none (read at most once a minute).\n"
                "# TYPE idemgate_archive_oldest_pending_seconds gauge\n"
                "idemgate_archive_oldest_pending_seconds %.3f\n",
                g->archive_pending, g->archive_oldest_s);
    enum archready_state arch = archready_check(cfg, NULL, 0);
    if (arch != ARCHREADY_NOT_USED)
        fprintf(f,
                "# HELP idemgate_archive_writable The archive took a probe copy at the last check "
                "(at most 5 s old); 0 makes /readyz fail.\n"
                "# TYPE idemgate_archive_writable gauge\nidemgate_archive_writable %d\n",
                arch == ARCHREADY_WRITABLE);
}

/* Whether the request's bearer token hashes to sha256_hex (64 hex digits). */
static int token_is(struct hs_req *r, const char *sha256_hex)
{
    char token[CRYPTO_SHA256_HEX];
    return strlen(sha256_hex) == 64 && reply_token_hash(r, token) == 0 &&
           crypto_ct_equal(token, sha256_hex, 64);
}

/* Process counters, and gauges read from the database (bounded labels only: states and
 * configured provider names). */
static void metrics_answer(struct hs_req *r)
{
    const struct cfg *cfg = api_cfg(r);
    struct gauge_read g = {.budget = {-1, -1}, .archive_pending = -1, .archive_oldest_s = -1};
    int e = store_gauges(api_db(r), add_gauge, &g);
    char *extra = NULL;
    size_t extra_len = 0;
    FILE *f = open_memstream(&extra, &extra_len);
    if (f) {
        render_gauges(f, cfg, &g, e == STORE_OK);
        if (fclose(f) != 0) {
            free(extra);
            extra = NULL;
        }
    }
    for (int i = 0; i < g.n_tripped; i++)
        free(g.tripped[i]);
    char *text = extra ? metrics_render(extra) : NULL;
    free(extra);
    if (!text) {
        reply_problem(r, 500, "internal", "Internal error", "out of memory", 0);
        return;
    }
    hs_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text), NULL);
    free(text);
}

/* GET /metrics where metrics are served: with metrics_token_sha256 set, only to that token or
 * the admin token (the console's safety view); 401 otherwise. */
void admin_metrics_serve(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    const struct cfg *cfg = api_cfg(r);
    if (*cfg->metrics_token_sha256 && !token_is(r, cfg->metrics_token_sha256) &&
        !token_is(r, cfg->admin_token_sha256)) {
        reply_problem(r, 401, "unauthorized", "Unauthorized",
                      "a valid `Authorization: Bearer <metrics token>` is required", 0);
        return;
    }
    metrics_answer(r);
}

/* GET /metrics on the API's listener. Once metrics have a listener of their own
 * (metrics_listen), the API's answers 404, as for any path it does not serve, so that every
 * tenant's spend and the review backlog never reach whoever can reach the API; only the admin
 * token still reads them here, for the console's safety view. */
void admin_metrics(struct hs_req *r, const struct api_args *a)
{
    const struct cfg *cfg = api_cfg(r);
    if (*cfg->metrics_listen_host && !token_is(r, cfg->admin_token_sha256)) {
        reply_problem(r, 404, "not-found", "Not found", "no such endpoint", 0);
        return;
    }
    if (*cfg->metrics_listen_host)
        metrics_answer(r);
    else
        admin_metrics_serve(r, a);
}

void admin_health(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    hs_respond(r, 200, "application/json", "{\"status\":\"ok\"}", 15, NULL);
}
