/*
 * idemgate-mock: path patterns with named captures, for provider routes such as
 * /v1/models/{owner}/{name}/predictions or /fal/{model+}/requests/{id}/status.
 *
 * A pattern is literal text with captures in braces:
 *   {name}   one or more characters without a slash (one path segment, or the start of
 *            one when literal text follows inside the segment, as in {m}:predictLongRunning)
 *   {name+}  one or more characters, slashes included (several segments)
 *   {name*}  the rest of the path, possibly empty; only at the end of a pattern
 * Matching is exact: the whole path must be consumed.  When a capture could end at several
 * places, the first split that lets the rest of the pattern match is taken, trying the
 * shortest capture first.
 */
#ifndef IDEMGATE_MOCK_ROUTE_H
#define IDEMGATE_MOCK_ROUTE_H

#include <stdbool.h>
#include <stddef.h>

/* Most captures one pattern may hold. */
#define ROUTE_MAX_CAPTURES 6

/* One captured piece of a path: it points into the pattern and the path it was matched on. */
struct route_capture {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
};

/* The captures of a successful match, valid while the pattern and the path are. */
struct route_match {
    size_t count;
    struct route_capture cap[ROUTE_MAX_CAPTURES];
};

/*
 * Returns true when path matches pattern as a whole and fills *m with the captures.
 * Returns false (and leaves *m undefined) otherwise, or when the pattern is malformed.
 */
bool route_match(const char *pattern, const char *path, struct route_match *m);

/*
 * Copies the capture called name into out (size bytes, NUL-terminated).  Returns false when
 * there is no such capture or it does not fit.
 */
bool route_capture(const struct route_match *m, const char *name, char *out, size_t size);

/*
 * Returns the value of the capture called name when it runs to the end of the path (a
 * {name*} capture always does), NUL-terminated there; NULL otherwise.
 */
const char *route_capture_tail(const struct route_match *m, const char *name);

/* Runs the matcher's own checks; returns the number of failures and names each on stdout. */
int route_self_test(void);

#endif
