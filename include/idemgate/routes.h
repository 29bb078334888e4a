#ifndef IDEMGATE_ROUTES_H
#define IDEMGATE_ROUTES_H

#include "idemgate/http_server.h"

#include <stddef.h>

/* Method + path → handler, from one table (PgBouncer's cmd_list[] is the model). A pattern is a
 * path whose segments are literals, "{name}" (one segment, possibly empty, never a '/') or, as
 * the last segment only, "*" (the rest of the path, possibly empty, '/' included). The first
 * entry whose method and pattern match wins; when patterns match but no method does, the answer
 * is 405 with an Allow header naming the methods that would; otherwise 404. */

#define ROUTE_MAX_ARGS 4

/* What a pattern captured: args[i] (not NUL-terminated, len[i] bytes) for each "{name}" in
 * order, and tail (NUL-terminated) for "*", or NULL. They point into the request's path. */
struct route_args {
    const char *arg[ROUTE_MAX_ARGS];
    size_t len[ROUTE_MAX_ARGS];
    size_t n;
    const char *tail;
};

typedef void (*route_fn)(struct hs_req *r, const struct route_args *a);

struct route {
    const char *method; /* NULL: any method */
    const char *pattern;
    int label; /* metrics.h enum metric_route */
    route_fn handler;
};

enum route_result { ROUTE_FOUND = 0, ROUTE_NOT_FOUND = -1, ROUTE_BAD_METHOD = -2 };

struct route_match {
    const struct route *route; /* FOUND: the entry; BAD_METHOD: the first entry of the path */
    struct route_args args;
    char allow[64]; /* BAD_METHOD: e.g. "POST" or "GET, POST" */
};

/* Looks method and path up in table[0..n): a pure function, for the router and its tests. */
enum route_result route_match(const struct route *table, size_t n, const char *method,
                              const char *path, struct route_match *m);

/* Copies args->arg[i] into out (cap bytes, NUL-terminated) and returns its length, or -1 when
 * there is no such argument or it does not fit. */
int route_arg(const struct route_args *a, size_t i, char *out, size_t cap);

/* The gateway's table (DESIGN.md §4). */
const struct route *routes_table(size_t *n);

/* Answers the request from the table: its handler, a 405 or a 404. */
void routes_dispatch(struct hs_req *r);

#endif
