#include "idemgate/api.h"

#include "idemgate/intake.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/reply.h"
#include "idemgate/routes.h"
#include "idemgate/store.h"

#include <pthread.h>
#include <stdlib.h>

struct api {
    const struct cfg *cfg;
    struct waiters *waiters;
    pthread_mutex_t mu; /* guards dbs */
    struct db **dbs;    /* every server thread's connection, closed by api_free */
    size_t n_dbs;
};

/* The API's state of one request (hs_req_state). */
struct api_state {
    struct api *api;
    int route;
    struct api_wait wait;
};

/* One database connection per server thread: the pool is sized to the threads. */
static __thread struct db *tls_db;

static struct api_state *state_of(const struct hs_req *r)
{
    return hs_req_state(r);
}

const struct cfg *api_cfg(const struct hs_req *r)
{
    return state_of(r)->api->cfg;
}

struct waiters *api_waiters(const struct hs_req *r)
{
    return state_of(r)->api->waiters;
}

struct api_wait *api_wait(struct hs_req *r)
{
    return &state_of(r)->wait;
}

void api_set_route(struct hs_req *r, int label)
{
    state_of(r)->route = label;
}

struct db *api_db(const struct hs_req *r)
{
    struct api *a = state_of(r)->api;
    if (!tls_db) {
        tls_db = store_db_open(a->cfg->database_url);
        if (!tls_db)
            return NULL;
        pthread_mutex_lock(&a->mu);
        struct db **nv = realloc(a->dbs, (a->n_dbs + 1) * sizeof(*nv));
        if (nv) {
            nv[a->n_dbs++] = tls_db;
            a->dbs = nv;
        }
        pthread_mutex_unlock(&a->mu);
    }
    return tls_db;
}

/* hs_options.handle: a new request is routed; a resumed one finishes its wait. */
static void on_handle(struct hs_req *r, void *app)
{
    if (!state_of(r)) {
        struct api_state *st = calloc(1, sizeof(*st));
        if (!st) {
            reply_problem(r, 500, "internal", "Internal error", "out of memory", 0);
            return;
        }
        st->api = app;
        st->route = MR_OTHER;
        hs_req_set_state(r, st, free);
    }
    if (state_of(r)->wait.active)
        intake_resume(r);
    else
        routes_dispatch(r);
}

static void on_reject(struct hs_req *r, enum hs_reject why, void *app)
{
    (void)app;
    if (why == HS_REJECT_FRAMING)
        reply_problem(r, 400, "bad-request-framing", "Ambiguous request framing",
                      "conflicting Content-Length/Transfer-Encoding or a malformed header name",
                      0);
    else
        reply_problem(r, 500, "internal", "Internal error", "no response was produced", 0);
}

static void on_done(struct hs_req *r, int status, double secs, int completed, void *app)
{
    (void)app;
    const struct api_state *st = state_of(r);
    int route = st ? st->route : MR_OTHER;
    metrics_http((enum metric_route)route, status, secs);
    /* One access line per request: ids and classes only, never a body, token or key. */
    LOG(status >= 500 ? LOG_WARN : LOG_INFO, "http", LS("request_id", hs_req_id(r)),
        LS("method", hs_req_method(r)), LS("route", metrics_route_name(route)),
        LI("status", status), LI("us", (long long)(secs * 1e6)), LI("completed", completed));
}

struct api *api_new(const struct cfg *cfg, struct waiters *w)
{
    struct api *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->cfg = cfg;
    a->waiters = w;
    pthread_mutex_init(&a->mu, NULL);
    return a;
}

struct hs_server *api_listen(struct api *a)
{
    const struct cfg *cfg = a->cfg;
    struct hs_options o = {.host = cfg->listen_host,
                           .port = cfg->listen_port,
                           .threads = (unsigned)cfg->http_threads,
                           .max_connections = (unsigned)cfg->max_connections,
                           .max_body_bytes = cfg->max_body_bytes,
                           .app = a,
                           .handle = on_handle,
                           .reject = on_reject,
                           .done = on_done};
    return hs_start(&o);
}

void api_free(struct api *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n_dbs; i++)
        store_db_close(a->dbs[i]);
    free(a->dbs);
    pthread_mutex_destroy(&a->mu);
    free(a);
}
