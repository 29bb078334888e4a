#ifndef IDEMGATE_HEADERS_H
#define IDEMGATE_HEADERS_H

#include <stddef.h>

/* Pure parsers of the request headers the client contract depends on. */

#define HDR_KEY_MAX 255

/* Parses an Idempotency-Key value of len bytes (value[0..len), as received: a NUL inside it is a
 * byte like any other, and refused): either an RFC 8941 sf-string ("…" with only \" and \\
 * escapes) or the bare form. The key is 1..255 printable ASCII characters (0x20..0x7e; the
 * bare form cannot start or end with a space). Writes the key, NUL-terminated, into out (which
 * holds HDR_KEY_MAX + 1 bytes) and returns its length, or -1 when the value is invalid or NULL. */
int hdr_idempotency_key(const char *value, size_t len, char out[HDR_KEY_MAX + 1]);

/* Extracts the token of "Bearer <token>" (scheme case-insensitive; spaces around the token are
 * ignored). The token is one or more visible ASCII characters (0x21..0x7e), of any length.
 * Returns a pointer into value and its length in *len, or NULL. */
const char *hdr_bearer(const char *value, size_t *len);

/* Returns N of a `wait=N` preference in a Prefer header (RFC 7240; other preferences are
 * ignored), capped at cap; 0 when absent or malformed. */
int hdr_prefer_wait(const char *value, int cap);

#endif
