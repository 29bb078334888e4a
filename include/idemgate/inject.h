#ifndef IDEMGATE_INJECT_H
#define IDEMGATE_INJECT_H

#include <stddef.h>

/* Puts a string member into a JSON object body without re-printing it (cJSON would change
 * numbers): the client reference a provider stores beside the task, e.g. "metadata.client_ref",
 * or the webhook URL. Pure functions on the client's body as stored (compacted by
 * inject_compact(), but whitespace between tokens is fine too). Member names are compared on
 * their decoded value (after JSON escapes, \uXXXX and surrogate pairs included), byte for byte
 * and case-sensitively: "metad\u0061ta" is the member "metadata". */

enum inject_err {
    INJECT_OK = 0,
    INJECT_ENOMEM = -1,     /* inject_member() only: out of memory */
    INJECT_ENOTOBJECT = -2, /* the body is not a JSON object (array, scalar, empty) */
    INJECT_EEXISTS = -3,    /* the member is already in the body */
    INJECT_EPARENT = -4,    /* the parent member exists but is not an object (null, string,
                               number, array, true, false) */
    INJECT_EFIELD = -5,     /* field is not "name" or "parent.name" (one dot at most, no empty
                               part), or NULL */
    INJECT_ESYNTAX = -6,    /* the body is not well-formed JSON, or names the parent twice */
};

/* A field spec split into its parts. */
struct inject_field {
    const char *parent, *name; /* parent: NULL for "name", else plen bytes ending at the dot */
    size_t plen, nlen;
};

/* Splits field, "name" or "parent.name", into *f (pointing into field). Returns 0, or
 * INJECT_EFIELD when field is NULL, empty, has more than one dot or an empty part. */
__attribute__((warn_unused_result)) int inject_field_split(const char *field,
                                                           struct inject_field *f);

/* Whether `field` can be placed in json[0..len), without building the result: INJECT_OK, or the
 * negative enum inject_err that inject_member() would return for the same arguments (memory
 * aside). field is "name" (a member of the body) or "parent.name" (a member of the body's member
 * `parent`, which is created when absent and must be an object when present).
 *
 * The checks, in this order: the field spec (INJECT_EFIELD); the body starts, after whitespace,
 * with '{' (INJECT_ENOTOBJECT); the body's top-level object and, when present, the parent object
 * are well formed and nothing follows the body (INJECT_ESYNTAX; values nested deeper are only
 * delimited, not validated); then INJECT_EPARENT or INJECT_EEXISTS. Members nested deeper than
 * the level looked at never count. Never reads outside json[0..len); json may be NULL only when
 * len is 0. */
__attribute__((warn_unused_result)) int inject_check(const char *json, size_t len,
                                                     const char *field);

/* Places "name":"value" as the first member of the body (field "name") or of its object member
 * `parent` (field "parent.name"; a missing parent is created as the body's first member). value
 * is written as a JSON string (quotes, backslashes and control characters escaped; other bytes
 * as they are, so it should be UTF-8); its length is not limited. Returns 0 with a new malloc'd,
 * NUL-terminated body in *out (*out_len bytes, the NUL not counted; the caller frees it), or the
 * negative enum inject_err that inject_check() returns for the same json, len and field (or
 * INJECT_ENOMEM), with *out NULL and *out_len 0: the body is then not changed, and the caller
 * decides whether it may be sent without the member. value, out and out_len must not be NULL. */
int inject_member(const char *json, size_t len, const char *field, const char *value, char **out,
                  size_t *out_len);

/* Name of an inject_err code, e.g. "member_exists"; never NULL. */
const char *inject_strerror(int code);

/* The body the client sent, without the whitespace between tokens: every number, string and
 * member order exactly as written (a canonical form would round numbers beyond 2^53). The
 * input must be valid JSON. Returns a new buffer (*out, *out_len) or -1 when out of memory.
 * The intake gets these bytes from its one parse (jcs_doc_take_compact); this independent
 * scanner is what the unit tests hold that to, as inject_check is for reqbody's placeable. */
int inject_compact(const char *json, size_t len, char **out, size_t *out_len);

#endif
