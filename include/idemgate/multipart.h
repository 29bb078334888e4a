#ifndef IDEMGATE_MULTIPART_H
#define IDEMGATE_MULTIPART_H

#include <stddef.h>

/* multipart/form-data bodies (RFC 7578 over RFC 2046): an image edit's files, a video's input
 * reference. The gateway forwards the client's bytes exactly as they came and fingerprints what
 * they mean: the parts' names, filenames, content types and a SHA-256 of each part's content,
 * whatever the boundary or the order of differently named parts. A pure module: no I/O.
 *
 * The reading is strict, so that what is fingerprinted is all that is sent: the body starts with
 * its first delimiter (no preamble), every part has one Content-Disposition `form-data` with a
 * `name` (and maybe a `filename`) and at most one Content-Type, no other header and no other
 * parameter; nothing but an optional CRLF follows the closing delimiter. */

#define MP_MAX_PARTS 128
#define MP_BOUNDARY_MAX 70 /* RFC 2046 */
/* Bytes mp_content_type_of needs: the type, a quoted longest boundary, the NUL. */
#define MP_CTYPE_MAX 104

struct mp_part {
    const char *name; /* raw bytes between the quotes (or the token), not unescaped */
    size_t name_len;
    const char *filename; /* NULL when the part has no filename parameter */
    size_t filename_len;
    const char *ctype; /* the Content-Type header's value, trimmed; NULL when absent */
    size_t ctype_len;
    const char *data; /* the content, pointing into the body */
    size_t data_len;
};

/* The boundary of a Content-Type `multipart/form-data; boundary=…` (token or quoted string,
 * 1..70 characters of RFC 2046's bchars, not ending in a space) into out (>= MP_BOUNDARY_MAX+1
 * bytes). Returns its length, or -1 when the type is not multipart/form-data or the boundary is
 * missing, repeated or malformed. */
int mp_boundary(const char *content_type, char out[MP_BOUNDARY_MAX + 1]);

/* Reads body[0..len) delimited by boundary into parts[0..*n) (at most max, each pointing into
 * body). Returns 0, or -1 with why (a sentence, no body bytes) filled. */
int mp_parse(const char *body, size_t len, const char *boundary, struct mp_part *parts,
             size_t max, size_t *n, char *why, size_t whylen);

/* The canonical form that is fingerprinted: "multipart/form-data\n", then per part, the parts
 * ordered by name (bytewise; parts of one name keep their order, which a provider reads as a
 * list), the name, filename and content type as netstrings ("-" for one absent) and the hex
 * SHA-256 of the content, one line each. It never begins like a JSON text, so a multipart body
 * and a JSON one never share a fingerprint. malloc'ed, NUL-terminated; NULL when out of memory. */
char *mp_canonical(const struct mp_part *parts, size_t n, size_t *len);

/* A JSON object of the text fields (the parts without a filename) whose name and value are
 * UTF-8 without control characters: name → the value as a JSON number when it is one (`n`,
 * `seconds`; white space around it, which a provider's parser may trim, is left out: a value
 * of "10\t" was left out whole), else as a string; a repeated name keeps its first value. What
 * the profile's paths (outputs asked for, pricing keys) read for a multipart body. malloc'ed,
 * NUL-terminated; NULL when out of memory. */
char *mp_fields_json(const struct mp_part *parts, size_t n, size_t *len);

/* The Content-Type a stored body is sent with: a multipart body (it begins with "--" and a valid
 * boundary followed by CRLF, which the intake requires of every multipart body it records) is
 * `multipart/form-data; boundary=…` with its own boundary, written into out (cap >= MP_CTYPE_MAX); returns
 * 1. Anything else (a JSON body never begins with "--"): returns 0 and out is "". */
int mp_content_type_of(const char *body, size_t len, char *out, size_t cap);

#endif
