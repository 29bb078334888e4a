#ifndef IDEMGATE_ROUTES_H
#define IDEMGATE_ROUTES_H

#include "idemgate/api.h"
#include "idemgate/http_server.h"

#include <stddef.h>

/* The API's front: method + path → handler, from one table (PgBouncer's cmd_list[] is the model). A
 * pattern is a path whose segments are literals, "{name}" (one segment, possibly empty, never a
 * '/') or, as the last segment only, "*" (the rest of the path, possibly empty, '/' included). The
 * first entry whose method and pattern match wins; when patterns match but no method does, the
 * answer is 405 with an Allow header naming the methods that would; otherwise 404. */

typedef void (*route_fn)(struct hs_req *r, const struct api_args *a);

struct route {
    const char *method; /* NULL: any method */
    const char *pattern;
    int label; /* metrics.h enum metric_route */
    route_fn handler;
    int offload; /* the handler waits on the database or a provider: it runs on a database
                    worker (api_offload), never on a server thread */
};

enum route_result { ROUTE_FOUND = 0, ROUTE_NOT_FOUND = -1, ROUTE_BAD_METHOD = -2 };

struct route_match {
    const struct route *route; /* FOUND: the entry; BAD_METHOD: the first entry of the path */
    struct api_args args;
    char allow[64]; /* BAD_METHOD: e.g. "POST" or "GET, POST" */
};

/* Looks method and path up in table[0..n): a pure function, for the router and its tests. */
enum route_result route_match(const struct route *table, size_t n, const char *method,
                              const char *path, struct route_match *m);

/* The start of every listener's handler (app: the struct api): begins a new request (500 when
 * out of memory), suspends one whose database work is still queued or running, or runs the
 * continuation of a resumed one. Returns 1 when r was dealt with, 0 for a new request the caller
 * routes. */
int route_enter(struct hs_req *r, void *app);

/* The gateway's table (DESIGN.md §4). */
const struct route *routes_table(size_t *n);

/* Starts the HTTP server (the configuration's listen address, threads and caps) with the API's
 * callbacks: a new request is answered from the table (its handler, a 405 or a 404), a resumed
 * one finishes its wait (intake.c); every request is counted and logged once over. Returns NULL
 * when it cannot listen. */
__attribute__((warn_unused_result)) struct hs_server *routes_listen(struct api *a);

#endif
