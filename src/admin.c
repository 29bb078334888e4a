#include "idemgate/admin.h"

#include "idemgate/api.h"
#include "idemgate/archready.h"
#include "idemgate/crypto.h"
#include "idemgate/jobview.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
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

/* POST /v1/admin/jobs/{id}/resume: polling of an accepted job whose poll deadline passed starts
 * again, for one more deadline of its provider. */
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
        reply_problem(r, 404, "job-not-found", "Job not found", "no accepted job with this id", 0);
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

static void add_job(const struct store_job *j, void *arg)
{
    char *json = jobview_json(j);
    if (json) {
        cJSON_AddItemToArray(arg, cJSON_CreateRaw(json));
        free(json);
    }
}

/* GET /v1/admin/jobs?state=S&provider=P&limit=N: every tenant's jobs, oldest first. */
void admin_jobs_list(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    if (!admin_ok(r))
        return;
    const char *state = hs_req_query(r, "state");
    const char *provider = hs_req_query(r, "provider");
    const char *lim = hs_req_query(r, "limit");
    char *end = NULL;
    long limit = lim ? strtol(lim, &end, 10) : 100;
    if ((state && st_parse(state) < 0) || (provider && (!*provider || strlen(provider) > 64)) ||
        (lim && (end == lim || *end)) || limit < 1 || limit > 1000) {
        reply_problem(r, 400, "invalid-query", "Invalid query",
                      "state must be a job state, provider 1..64 characters and limit within "
                      "1..1000",
                      0);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    int e = store_admin_jobs_list(api_db(r), state, provider, (int)limit, add_job, data);
    if (e < 0) {
        cJSON_Delete(o);
        reply_store_error(r, e);
        return;
    }
    reply_json(r, 200, o);
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
void admin_ready(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    int version = 0;
    int e = store_schema_version(api_db(r), &version);
    /* A newer schema is fine: migrations are additive, so a replica of the previous release
     * stays ready while a rollout migrates ahead of it. */
    int ready = e == STORE_OK && version >= migrate_latest();
    char why[256] = "";
    enum archready_state arch = archready_check(api_cfg(r), why, sizeof(why));
    cJSON *o = cJSON_CreateObject();
    cJSON *ready_item = cJSON_AddBoolToObject(o, "ready", 0);
    cJSON_AddBoolToObject(o, "database", e == STORE_OK);
    cJSON_AddNumberToObject(o, "schema_version", version);
    cJSON_AddNumberToObject(o, "schema_expected", migrate_latest());
    cJSON_AddStringToObject(o, "archive",
                            arch == ARCHREADY_NOT_USED   ? "not_used"
                            : arch == ARCHREADY_WRITABLE ? "writable"
                                                         : "unwritable");
    if (arch == ARCHREADY_UNWRITABLE) {
        cJSON_AddStringToObject(o, "archive_error", why);
        ready = 0;
    }
    cJSON *failing = cJSON_AddArrayToObject(o, "failing_statements");
    if (sh_failing(add_failing, failing) > 0)
        ready = 0;
    cJSON *tripped = cJSON_AddArrayToObject(o, "tripped_providers");
    if (ready)
        ready = store_breaker_list(api_db(r), add_breaker, tripped) == STORE_OK;
    ready_item->type = ready ? cJSON_True : cJSON_False;
    reply_json(r, ready ? 200 : 503, o);
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
        n += snprintf(g->buf + g->len + n, cap - (size_t)n,
                      "idemgate_operations{state=\"%s\"} %lld\n", name, value);
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
    struct gauge_text g = {.len = 0};
    const struct cfg *cfg = api_cfg(r);
    g.buf[0] = '\0';
    int e = store_gauges(api_db(r), add_gauge, &g);
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
    enum archready_state arch = archready_check(cfg, NULL, 0);
    cap = sizeof(g.buf) - g.len;
    n = arch == ARCHREADY_NOT_USED
            ? 0
            : snprintf(g.buf + g.len, cap,
                       "# HELP idemgate_archive_writable The archive took a probe copy at the "
                       "last check (at most 5 s old); 0 makes /readyz fail.\n"
                       "# TYPE idemgate_archive_writable gauge\nidemgate_archive_writable %d\n",
                       arch == ARCHREADY_WRITABLE);
    if (n > 0 && (size_t)n < cap)
        g.len += (size_t)n;
    char *text = metrics_render(g.buf);
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
