#ifndef IDEMGATE_API_H
#define IDEMGATE_API_H

#include "idemgate/config.h"
#include "idemgate/http_server.h"
#include "idemgate/waiters.h"

/* The API's context on top of the transport (DESIGN.md §4): what the handlers need per database
 * worker (a connection), per request (a metrics label, the state of a `Prefer: wait`)
 * and from the path (what the route's pattern captured). routes.c wires it to the transport. */

struct api;
struct db;
struct offload;
struct recorder;

/* The API's context. cfg, w, rec and pool (its database workers) must outlive it. Returns NULL
 * when out of memory. */
__attribute__((warn_unused_result)) struct api *api_new(const struct cfg *cfg, struct waiters *w,
                                                        struct recorder *rec,
                                                        struct offload *pool);
const struct cfg *api_config(const struct api *a);
/* Closes the database workers' connections and frees a. Only after hs_stop and offload_close:
 * no thread may use them any more. Accepts NULL. */
void api_free(struct api *a);

/* Gives a new request the API's state (metrics label "other", no wait). Returns 0, or -1 when
 * out of memory. */
__attribute__((warn_unused_result)) int api_req_begin(struct hs_req *r, struct api *a);
/* Whether api_req_begin was called for r; and its metrics label (MR_OTHER without state). */
int api_req_begun(const struct hs_req *r);
int api_req_route(const struct hs_req *r);

#define API_MAX_ARGS 4

/* What a route's pattern captured from the path (routes.h): arg[i] (not NUL-terminated, len[i]
 * bytes) for each "{name}" in order, and tail (NUL-terminated) for a final "*", or NULL. They
 * point into the request's path. */
struct api_args {
    const char *arg[API_MAX_ARGS];
    size_t len[API_MAX_ARGS];
    size_t n;
    const char *tail;
};

/* Copies a->arg[i] into out (cap bytes, NUL-terminated) and returns its length, or -1 when there
 * is no such argument or it does not fit. */
int api_arg(const struct api_args *a, size_t i, char *out, size_t cap);

/* What a request keeps across a suspension (`Prefer: wait`, intake.c). */
struct api_wait {
    int replayed; /* the answer is a replay */
    char job_id[32];
    char token_hash[65];
    long long tenant_id;
    int wait_seconds;
};

/* For handlers, on a server thread. */
const struct cfg *api_cfg(const struct hs_req *r);
/* The database connection of the calling thread (opened on first use), or NULL. Only database
 * workers (api_offload) call it: a server thread never waits on the database. */
struct db *api_db(const struct hs_req *r);
/* Reads the tenant limits again on a database worker when they are due (limits.h); never
 * waits. */
void api_limits_refresh(struct hs_req *r);
/* Reads the tenant directory again on a database worker when it is due (tenants.h); never
 * waits. */
void api_tenants_refresh(struct hs_req *r);
/* The same, from a's server callbacks (no request yet: a body's first bytes). */
void api_tenants_refresh_of(struct api *a);
/* Who a bearer token is (authorization: the header's value, NULL: none), for sharing memory and
 * queues between callers, never for answering one: a tenant's id as the directory last read
 * it, however long ago (> 0), API_CALLER_ADMIN, or API_CALLER_UNKNOWN (no token, another). */
#define API_CALLER_UNKNOWN 0
#define API_CALLER_ADMIN (-1)
long long api_token_caller(const struct api *a, const char *authorization);
/* Suspends r and runs fn(r, args) on a database worker (args is copied; its strings point into
 * the request). fn answers (hs_respond from that thread: the answer is queued when r resumes) or
 * leaves r to the continuation set before (api_set_continuation); then r is resumed. -1 when the
 * workers are closed (shutting down): r is resumed at once and the caller answers (a 503). */
__attribute__((warn_unused_result)) int api_offload(struct hs_req *r,
                                                    void (*fn)(struct hs_req *r,
                                                               const struct api_args *a),
                                                    const struct api_args *args);
struct waiters *api_waiters(const struct hs_req *r);
struct recorder *api_recorder(const struct hs_req *r);
struct api_wait *api_wait(struct hs_req *r);
/* What a suspended request does when it is resumed: fn(r), once, instead of being routed again.
 * Set it before hs_suspend. api_take_continuation returns it (NULL: none) and clears it. */
void api_set_continuation(struct hs_req *r, void (*fn)(struct hs_req *r));
void (*api_take_continuation(struct hs_req *r))(struct hs_req *r);
/* A handler's own state across suspensions, freed (free_fn) with the request. */
void api_set_ctx(struct hs_req *r, void *ctx, void (*free_fn)(void *ctx));
void *api_ctx(const struct hs_req *r);
/* Whether r's api_offload work is queued or running: a request resumed meanwhile (by a drain
 * that timed out) is suspended again rather than handled twice at once. */
int api_req_offloaded(const struct hs_req *r);
/* The metrics label of the request (metrics.h enum metric_route). */
void api_set_route(struct hs_req *r, int label);

#endif
