#include "idemgate/routes.h"

#include "idemgate/admin.h"
#include "idemgate/console.h"
#include "idemgate/headers.h"
#include "idemgate/intake.h"
#include "idemgate/jobs.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/outputs.h"
#include "idemgate/rawpath.h"
#include "idemgate/reply.h"
#include "idemgate/usage.h"
#include "idemgate/webhooks.h"

#include <stdio.h>
#include <string.h>

/* Every endpoint of DESIGN.md §4, and the operator's. HEAD is served wherever GET is (probes
 * and scrapers vary); any other method on a known path is a 405. */
/* Intake and GET /v1/jobs/{id} answer from memory when they can and hand the rest to the
 * database workers themselves; /healthz never touches the database. */
static const struct route table[] = {
    {"POST", "/v1/providers/*", MR_INTAKE, intake_handle, 0},
    {"GET", "/v1/jobs", MR_JOB_LIST, jobs_list, 1},
    {"GET", "/v1/jobs/{id}", MR_JOB_GET, jobs_get, 0},
    {"GET", "/v1/jobs/{id}/outputs/{n}", MR_JOB_GET, outputs_get, 1},
    {"POST", "/v1/jobs/{id}/resolve", MR_RESOLVE, jobs_resolve, 1},
    {"POST", "/v1/jobs/{id}/cancel", MR_CANCEL, jobs_cancel, 1},
    {"POST", "/v1/jobs/{id}/regenerate", MR_REGENERATE, jobs_regenerate, 1},
    {"GET", "/v1/usage", MR_USAGE, usage_get, 1},
    {"GET", "/v1/admin/jobs", MR_ADMIN, admin_jobs_list, 1},
    {"GET", "/v1/admin/jobs/{id}", MR_ADMIN, admin_job_get, 1},
    {"GET", "/v1/admin/jobs/{id}/outputs/{n}", MR_ADMIN, admin_job_output, 1},
    {"GET", "/v1/admin/overview", MR_ADMIN, admin_overview, 1},
    {"GET", "/v1/admin/providers", MR_ADMIN, admin_providers, 1},
    {"POST", "/v1/admin/providers/{name}/reset", MR_ADMIN, admin_reset, 1},
    {"POST", "/v1/admin/jobs/{id}/resume", MR_ADMIN, admin_resume, 1},
    {"GET", "/console", MR_CONSOLE, console_page, 0},
    {"GET", "/console/{asset}", MR_CONSOLE, console_asset, 0},
    {"POST", "/v1/webhooks/*", MR_WEBHOOK, webhooks_receive, 1},
    {"GET", "/metrics", MR_METRICS, admin_metrics, 1},
    {"GET", "/healthz", MR_HEALTH, admin_health, 0},
    {"GET", "/readyz", MR_READY, admin_ready, 1},
};

const struct route *routes_table(size_t *n)
{
    *n = sizeof(table) / sizeof(table[0]);
    return table;
}

/* Whether path matches pattern; fills args. */
static int pattern_match(const char *pattern, const char *path, struct api_args *a)
{
    const char *p = pattern, *s = path;
    memset(a, 0, sizeof(*a));
    while (*p) {
        if (p[0] == '*' && p[1] == '\0') {
            a->tail = s;
            return 1;
        }
        if (*p == '{') {
            const char *close = strchr(p, '}');
            size_t n = strcspn(s, "/");
            if (!close || a->n == API_MAX_ARGS)
                return 0;
            a->arg[a->n] = s;
            a->len[a->n++] = n;
            p = close + 1;
            s += n;
            continue;
        }
        if (*p != *s)
            return 0;
        p++;
        s++;
    }
    return *s == '\0';
}

/* Appends method to the comma-separated allow list unless it is there already. */
static void allow_add(char *allow, size_t cap, const char *method)
{
    size_t len = strlen(allow), n = strlen(method);
    for (const char *q = allow; (q = strstr(q, method)); q += n)
        if ((q == allow || q[-1] == ' ') && (q[n] == ',' || q[n] == '\0'))
            return;
    if (len + n + 3 > cap)
        return;
    if (len)
        memcpy(allow + len, ", ", 2), len += 2;
    memcpy(allow + len, method, n + 1);
}

enum route_result route_match(const struct route *t, size_t n, const char *method, const char *path,
                              struct route_match *m)
{
    struct api_args args;
    memset(m, 0, sizeof(*m));
    for (size_t i = 0; i < n; i++) {
        if (!pattern_match(t[i].pattern, path, &args))
            continue;
        if (!t[i].method || strcmp(t[i].method, method) == 0 ||
            (strcmp(method, "HEAD") == 0 && strcmp(t[i].method, "GET") == 0)) {
            m->route = &t[i];
            m->args = args;
            return ROUTE_FOUND;
        }
        if (!m->route)
            m->route = &t[i];
        allow_add(m->allow, sizeof(m->allow), t[i].method);
        if (strcmp(t[i].method, "GET") == 0)
            allow_add(m->allow, sizeof(m->allow), "HEAD");
    }
    return m->route ? ROUTE_BAD_METHOD : ROUTE_NOT_FOUND;
}

/* 400 bad-path: a path whose meaning depends on who decodes it (rawpath.h). */
static void bad_path(struct hs_req *r, enum rawpath_verdict v)
{
    char detail[160];
    snprintf(detail, sizeof(detail),
             "the path is matched as sent; refused: %s (encoded slashes, NUL and other control "
             "bytes, malformed escapes and dot segments are)",
             rawpath_verdict_name(v));
    LOG(LOG_INFO, "http_path_refused", LS("request_id", hs_req_id(r)),
        LS("reason", rawpath_verdict_name(v)));
    reply_problem(r, 400, "bad-path", "Malformed path", detail, 0);
}

static void dispatch(struct hs_req *r)
{
    struct route_match m;
    size_t n;
    const struct route *t = routes_table(&n);
    /* The table is matched against the path as sent (rawpath.h): what a proxy in front sees. */
    const char *path = hs_req_path(r);
    enum rawpath_verdict v = rawpath_check(path, strlen(path));
    if (v != RAWPATH_OK) {
        bad_path(r, v);
        return;
    }
    enum route_result res = route_match(t, n, hs_req_method(r), path, &m);
    if (res == ROUTE_NOT_FOUND) {
        reply_problem(r, 404, "not-found", "Not found", "no such endpoint", 0);
        return;
    }
    api_set_route(r, m.route->label);
    if (res == ROUTE_BAD_METHOD)
        reply_problem(r, 405, "method-not-allowed", "Method not allowed", m.allow, 0);
    else if (!m.route->offload)
        m.route->handler(r, &m.args);
    else if (api_offload(r, m.route->handler, &m.args) < 0)
        reply_shutting_down(r); /* the database workers have stopped */
}

int route_enter(struct hs_req *r, void *app)
{
    if (!api_req_begun(r) && api_req_begin(r, app) < 0) {
        reply_problem(r, 500, "internal", "Internal error", "out of memory", 0);
        return 1;
    }
    if (api_req_offloaded(r)) {
        hs_suspend(r); /* its database worker answers and resumes it */
        return 1;
    }
    void (*cont)(struct hs_req *) = api_take_continuation(r);
    if (cont)
        cont(r);
    return cont != NULL;
}

/* hs_options.handle: a new request is routed; a resumed one goes on where it stopped. */
static void on_handle(struct hs_req *r, void *app)
{
    if (!route_enter(r, app))
        dispatch(r);
}

static void on_reject(struct hs_req *r, enum hs_reject why, void *app)
{
    (void)app;
    if (why == HS_REJECT_FRAMING)
        reply_problem(r, 400, "bad-request-framing", "Ambiguous request framing",
                      "conflicting Content-Length/Transfer-Encoding or a malformed header name", 0);
    else if (why == HS_REJECT_HEADER_BYTES)
        reply_problem(r, 400, "bad-header", "Malformed header",
                      "a header line holds a NUL byte", 0);
    else if (why == HS_REJECT_BAD_TARGET)
        bad_path(r, RAWPATH_NUL);
    else if (why == HS_REJECT_FULL)
        reply_problem(r, 503, "server-full", "Server full",
                      "every connection is taken; only /healthz is served on this one", 1);
    else if (why == HS_REJECT_DRAINING)
        reply_shutting_down(r);
    else if (why == HS_REJECT_URI_TOO_LONG)
        reply_problem(r, 414, "uri-too-long", "URI too long",
                      "the request target is longer than 8192 bytes or has more than 64 query "
                      "parameters",
                      0);
    else if (why == HS_REJECT_BODY_MEMORY)
        reply_problem(r, 503, "bodies-full", "Too many request bodies in memory",
                      "the request bodies this replica holds at once reached "
                      "max_buffered_body_bytes; nothing was recorded, retry later",
                      1);
    else
        reply_problem(r, 500, "internal", "Internal error", "no response was produced", 0);
}

static void on_done(struct hs_req *r, int status, double secs, int completed, void *app)
{
    (void)app;
    int route = api_req_route(r);
    metrics_http((enum metric_route)route, status, secs);
    /* One access line per request: ids and classes only, never a body, token or key. */
    LOG(status >= 500 ? LOG_WARN : LOG_INFO, "http", LS("request_id", hs_req_id(r)),
        LS("method", hs_req_method(r)), LS("route", metrics_route_name(route)),
        LI("status", status), LI("us", (long long)(secs * 1e6)), LI("completed", completed));
}

/* hs_options.upload_allowed: the path names a provider route that takes multipart uploads (as
 * sent: a path the router would refuse, or would decode first, gets the plain body cap). */
static int upload_allowed(const char *path, void *app)
{
    static const char prefix[] = "/v1/providers/";
    if (strncmp(path, prefix, sizeof(prefix) - 1) != 0)
        return 0;
    const char *target = path + sizeof(prefix) - 1, *slash = strchr(target, '/');
    const struct cfg *cfg = api_config(app);
    const struct cfg_provider *p =
        slash ? cfg_find_provider(cfg, target, (size_t)(slash - target)) : NULL;
    size_t len = slash ? strcspn(slash + 1, "?") : 0;
    const struct cfg_route *rt = p ? cfg_find_route(p, slash + 1, len) : NULL;
    return rt && rt->multipart;
}

/* hs_options.body_owner: the tenant whose bearer token it is in the directory — as last read,
 * however long ago: traffic refreshes it, and a quiet gateway whose tenants' requests were all
 * refused here would never read it again — whose bodies hold at most a quarter of
 * max_buffered_body_bytes; or the operator. Any other request's body — no token, a random one, a
 * provider's webhook, a tenant added since the last read — shares half of
 * max_buffered_body_bytes with the others like it, and asks for the directory to be read again
 * (at most every TENANTS_REFRESH_S), so that a new tenant is known a moment later. */
static long long body_owner(const char *authorization, void *app)
{
    long long id = api_token_caller(app, authorization);
    if (id == API_CALLER_ADMIN)
        return HS_OWNER_OPERATOR;
    if (id > 0)
        return id;
    size_t len = 0;
    if (hdr_bearer(authorization, &len))
        api_tenants_refresh_of(app);
    return HS_OWNER_UNKNOWN;
}

struct hs_server *routes_listen(struct api *a)
{
    const struct cfg *cfg = api_config(a);
    struct hs_options o = {.host = cfg->listen_host,
                           .port = cfg->listen_port,
                           .threads = (unsigned)cfg->http_threads,
                           .max_connections = (unsigned)cfg->max_connections,
                           .max_connections_per_address =
                               (unsigned)(cfg->max_connections_per_address
                                              ? cfg->max_connections_per_address
                                              : cfg->max_connections / 4),
                           .request_deadline_s = cfg->request_deadline_seconds,
                           .max_body_bytes = cfg->max_body_bytes,
                           .max_upload_bytes = cfg->max_upload_bytes,
                           .max_buffered_bytes = cfg->max_buffered_body_bytes,
                           .upload_allowed = upload_allowed,
                           .body_owner = body_owner,
                           .app = a,
                           .handle = on_handle,
                           .reject = on_reject,
                           .done = on_done};
    return hs_start(&o);
}
