#ifndef IDEMGATE_API_H
#define IDEMGATE_API_H

#include "idemgate/config.h"
#include "idemgate/http_server.h"
#include "idemgate/waiters.h"

/* The client-facing API (DESIGN.md §4) on top of the transport: what it needs per server thread
 * (a database connection) and per request (a metrics label, the state of a `Prefer: wait`), and
 * the callbacks that route requests (routes.c) and count and log them once answered. */

struct api;
struct db;

/* The API's context. cfg and w must outlive it. Returns NULL when out of memory. */
__attribute__((warn_unused_result)) struct api *api_new(const struct cfg *cfg,
                                                        struct waiters *w);
/* Starts the HTTP server (cfg's listen address, threads and caps) with the API's callbacks.
 * Returns NULL when it cannot listen. */
__attribute__((warn_unused_result)) struct hs_server *api_listen(struct api *a);
/* Closes the per-thread database connections and frees a. Only after hs_stop: no server thread
 * may use them any more. Accepts NULL. */
void api_free(struct api *a);

/* What a request keeps across a suspension (`Prefer: wait`, intake.c). */
struct api_wait {
    int active;   /* the request is suspended or was resumed */
    int replayed; /* the answer is a replay */
    char job_id[32];
    char token_hash[65];
    int wait_seconds;
};

/* For handlers, on a server thread. */
const struct cfg *api_cfg(const struct hs_req *r);
/* The database connection of the calling server thread (opened on first use), or NULL. */
struct db *api_db(const struct hs_req *r);
struct waiters *api_waiters(const struct hs_req *r);
struct api_wait *api_wait(struct hs_req *r);
/* The metrics label of the request (metrics.h enum metric_route). */
void api_set_route(struct hs_req *r, int label);

#endif
