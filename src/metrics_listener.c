#include "idemgate/metrics_listener.h"

#include "idemgate/admin.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/reply.h"
#include "idemgate/routes.h"

/* Everything this listener serves: metrics and the probes, nothing of the API. */
static const struct route table[] = {
    {"GET", "/metrics", MR_METRICS, admin_metrics_serve, 1},
    {"GET", "/healthz", MR_HEALTH, admin_health, 0},
    {"GET", "/readyz", MR_READY, admin_ready_serve, 1},
};

/* A new request is looked up in the table; a resumed one goes on where it stopped (its
 * database worker answered, or the drain resumed it). */
static void on_handle(struct hs_req *r, void *app)
{
    if (route_enter(r, app))
        return;
    struct route_match m;
    enum route_result res =
        route_match(table, sizeof(table) / sizeof(table[0]), hs_req_method(r), hs_req_path(r), &m);
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
        reply_shutting_down(r);
}

static void on_reject(struct hs_req *r, enum hs_reject why, void *app)
{
    (void)app;
    if (why == HS_REJECT_FRAMING)
        reply_problem(r, 400, "bad-request-framing", "Ambiguous request framing",
                      "conflicting Content-Length/Transfer-Encoding or a malformed header name", 0);
    else if (why == HS_REJECT_DRAINING)
        reply_shutting_down(r);
    else if (why == HS_REJECT_URI_TOO_LONG)
        reply_problem(r, 414, "uri-too-long", "URI too long", "the request target is too long", 0);
    else
        reply_problem(r, 500, "internal", "Internal error", "no response was produced", 0);
}

/* Counted with the API's requests (by route) and logged once, never with a header's value. */
static void on_done(struct hs_req *r, int status, double secs, int completed, void *app)
{
    (void)app;
    int route = api_req_route(r);
    metrics_http((enum metric_route)route, status, secs);
    LOG(status >= 500 ? LOG_WARN : LOG_INFO, "http", LS("request_id", hs_req_id(r)),
        LS("listener", "metrics"), LS("method", hs_req_method(r)),
        LS("route", metrics_route_name(route)), LI("status", status),
        LI("us", (long long)(secs * 1e6)), LI("completed", completed));
}

struct hs_server *ml_listen(struct api *a)
{
    const struct cfg *cfg = api_config(a);
    /* A scraper and a few probes: two threads and a small connection cap are plenty, and no
     * request here has a body. The API's whole-request deadline holds here too. */
    struct hs_options o = {.host = cfg->metrics_listen_host,
                           .port = cfg->metrics_listen_port,
                           .threads = 2,
                           .max_connections = 64,
                           .request_deadline_s = cfg->request_deadline_seconds,
                           .max_body_bytes = 1024,
                           .app = a,
                           .handle = on_handle,
                           .reject = on_reject,
                           .done = on_done};
    return hs_start(&o);
}
