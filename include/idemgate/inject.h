#ifndef IDEMGATE_INJECT_H
#define IDEMGATE_INJECT_H

#include <stddef.h>

/* Puts a string member into a JSON object body without re-printing it (cJSON would change
 * numbers): the client reference a provider stores beside the task, e.g. "metadata.client_ref".
 * Pure; works on the compact, valid JSON the gateway stores.
 *
 * field is "name" or "parent.name". A missing parent object is created. Returns 0 with a new
 * malloc'd body in *out, or -1 when the body is not an object, the parent exists but is not an
 * object, the member already exists, or memory runs out; the caller then sends the body as it
 * is (the header reference still goes). value must be JSON-safe (ids: [A-Za-z0-9_-]). */
int inject_member(const char *json, size_t len, const char *field, const char *value, char **out,
                  size_t *out_len);

/* The body the client sent, without the whitespace between tokens: every number, string and
 * member order exactly as written (a canonical form would round numbers beyond 2^53). The
 * input must be valid JSON. Returns a new buffer (*out, *out_len) or -1 when out of memory. */
int inject_compact(const char *json, size_t len, char **out, size_t *out_len);

#endif
