#ifndef IDEMGATE_RAWPATH_H
#define IDEMGATE_RAWPATH_H

#include <stddef.h>

/* Which request paths the router accepts, judged on the path as it was sent (before any
 * percent-decoding). Routing on a decoded path let "/%761/admin/providers",
 * "/v1%2Fadmin%2Fproviders" or "/metrics%00" reach handlers that a proxy in front, filtering by
 * path prefix, meant to hide. The router therefore matches the raw path, byte for byte, against
 * its literal patterns, and refuses outright (400) the forms whose meaning depends on who decodes
 * them: an encoded '/' or '\', a NUL (raw or encoded), any other control byte, a malformed
 * escape and a dot segment ("." or "..", raw or encoded). Any other escape is kept as sent, so
 * "/%6detrics" is simply no route (404). */

enum rawpath_verdict {
    RAWPATH_OK = 0,
    RAWPATH_NOT_ORIGIN,    /* empty, or not starting with '/' ("*", an absolute URL) */
    RAWPATH_BAD_ESCAPE,    /* '%' not followed by two hex digits */
    RAWPATH_NUL,           /* %00 (a raw NUL never reaches this function: the caller says) */
    RAWPATH_ENCODED_SLASH, /* %2F or %5C */
    RAWPATH_CONTROL,       /* a byte outside 0x21..0x7e, raw or encoded, or a raw '\' */
    RAWPATH_DOT_SEGMENT,   /* a segment that decodes to "." or ".." */
};

/* Judges path[0..len), the request target up to (not including) its '?'. A pure function: the
 * first fault from the left decides. */
enum rawpath_verdict rawpath_check(const char *path, size_t len);

/* A fixed name for a verdict, for logs, problems and tests ("ok", "not_origin_form",
 * "malformed_escape", "nul", "encoded_slash", "control_byte", "dot_segment"). */
const char *rawpath_verdict_name(enum rawpath_verdict v);

#endif
