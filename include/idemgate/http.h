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

struct http_server *http_start(const struct cfg *cfg, struct waiters *w);
/* Stops accepting new connections (in-flight requests continue). */
void http_quiesce(struct http_server *s);
/* Waits up to timeout_ms for the requests in progress to be answered. */
void http_drain(struct http_server *s, int timeout_ms);
/* Stops the server: call waiters_stop first so that no connection is left suspended. */
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
 * again with the same request. */
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
