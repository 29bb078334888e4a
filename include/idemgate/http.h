#ifndef IDEMGATE_HTTP_H
#define IDEMGATE_HTTP_H

#include "idemgate/config.h"
#include "idemgate/waiters.h"

#include <stddef.h>

/* The libmicrohttpd server: connection set-up, body accumulation under a cap, request framing
 * checks, per-thread database connections, suspend/resume, and the response helpers the API
 * handlers (api.c) use. */

struct http_server;
struct http_req;
struct db;

/* Starts listening. w is used by handlers until http_stop returns, so it must outlive the
 * server. Returns NULL when it cannot listen. */
__attribute__((warn_unused_result)) struct http_server *http_start(const struct cfg *cfg,
                                                                   struct waiters *w);
/* The shutdown, in this order:
 *   http_quiesce  stop accepting: new connections are refused (ECONNREFUSED) and those not yet
 *                 accepted are reset, never left queued; requests in progress continue and every
 *                 answer from now on closes its connection, so kept-alive clients go away.
 *   waiters_close wake the waiting clients (answered with the current state) and refuse new
 *                 waits: a request arriving on a kept-alive connection is answered at once.
 *   http_drain    wait up to timeout_ms for the requests in progress to be answered; a request
 *                 still suspended then is resumed (and answered) rather than left behind.
 *   http_stop     resume whatever is still suspended, stop libmicrohttpd (no server thread
 *                 runs afterwards), close the listening socket and the per-thread database
 *                 connections, free the server.
 *   waiters_free  only now, when no handler can reach the waiters any more.
 * Each accepts NULL and does nothing twice. */
void http_quiesce(struct http_server *s);
void http_drain(struct http_server *s, int timeout_ms);
void http_stop(struct http_server *s);

/* For handlers: the route label of the request's metrics (metrics.h enum metric_route). */
void http_req_set_route(struct http_req *r, int route);

/* For handlers. */
const char *http_req_method(const struct http_req *r);
const char *http_req_path(const struct http_req *r);
const char *http_req_id(const struct http_req *r);
const char *http_req_header(const struct http_req *r, const char *name);
/* A query-string argument, or NULL. */
const char *http_req_query(const struct http_req *r, const char *name);
/* How many times header `name` occurs. */
int http_req_header_count(const struct http_req *r, const char *name);
const char *http_req_body(const struct http_req *r, size_t *len);
int http_req_body_too_large(const struct http_req *r);
/* The database connection of the calling server thread. */
struct db *http_req_db(const struct http_req *r);
const struct cfg *http_req_cfg(const struct http_req *r);
struct waiters *http_req_waiters(const struct http_req *r);

/* Handler state kept across a suspension (api.c owns the meaning). */
struct http_wait {
    int active;       /* the request is suspended or was resumed */
    int replayed;     /* the answer is a replay */
    char job_id[32];
    char token_hash[65];
    int wait_seconds;
};
struct http_wait *http_req_wait(struct http_req *r);

/* Suspends the request until http_resume(r) (from any thread); the handler is then called
 * again with the same request. Every suspension must be paired with a way out: a registered
 * waiter, or an immediate http_resume when none could be registered. http_resume after the
 * request was already resumed (by http_drain or http_stop at shutdown) does nothing. */
void http_suspend(struct http_req *r);
void http_resume(void *r);

/* Queue a response. headers: NULL-terminated list of name, value pairs; may be NULL. */
int http_respond(struct http_req *r, int status, const char *content_type, const char *body,
                 size_t len, const char *const *headers);
/* An RFC 9457 problem: type is the last segment of a stable URN
 * ("urn:idemgate:problem:<type>"). retry_after > 0 adds a Retry-After header. */
int http_problem(struct http_req *r, int status, const char *type, const char *title,
                 const char *detail, int retry_after);

#endif
