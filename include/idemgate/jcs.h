#ifndef IDEMGATE_JCS_H
#define IDEMGATE_JCS_H

#include <stddef.h>

/* RFC 8785 (JSON Canonicalization Scheme) from raw request bytes, strict about RFC 8259: two
 * bodies that mean the same JSON get byte-identical canonical forms, and anything that is not
 * unambiguous JSON is refused rather than guessed at.
 *
 * One deliberate difference from RFC 8785, for numbers: two bodies whose numbers have different
 * exact decimal values never share a canonical form, even when the values round to one IEEE
 * double (9007199254740993 and 9007199254740992; 0.1 and 0.10000000000000001; 1e-400 and 0).
 * Each number is written from its exact value, in the ECMAScript layout RFC 8785 uses; that is
 * byte-identical to RFC 8785 whenever the number is spelt with the shortest digits of its
 * double (in any form: 1, 1.0, 1e0, 10e-1, 1E23 = 100000000000000000000000, -0 = 0), and its
 * own normalised digits otherwise. */

enum jcs_err {
    JCS_OK = 0,
    JCS_ENOMEM = -1,    /* allocation failed, or the input is 4 GiB or larger */
    JCS_ESYNTAX = -2,   /* not JSON (RFC 8259 grammar), including empty input */
    JCS_EDUPKEY = -3,   /* an object has the same member name twice (after unescaping) */
    JCS_ENUMBER = -4,   /* a number whose nearest IEEE-754 double is infinite (e.g. 1e999), or a
                           non-zero one written with an exponent of 10^15 or more in magnitude */
    JCS_EDEPTH = -5,    /* nesting deeper than max_depth */
    JCS_EUTF8 = -6,     /* invalid UTF-8, or a lone surrogate in a \u escape */
    JCS_ETRAILING = -7, /* non-whitespace bytes after the top-level value */
};

struct jcs_error {
    int code;         /* one of enum jcs_err */
    size_t offset;    /* byte offset in the input where the problem was found */
    const char *what; /* static English phrase, e.g. "duplicate member name" */
};

/* Parses in[0..len) strictly (it need not be NUL-terminated and may contain NUL bytes, which are
 * a syntax error outside strings and must be escaped inside them) and writes its RFC 8785
 * canonical form (with exact numbers, see above) to a new malloc'd buffer (*out, *out_len;
 * NUL-terminated for convenience, the NUL not counted). Objects and arrays nested deeper than
 * max_depth (top-level value = depth 1) fail. Returns 0, or a negative enum jcs_err with *err
 * filled (err may be NULL). On failure *out is NULL. The caller frees *out with free(). out and
 * out_len must not be NULL; in may be NULL only when len is 0.
 *
 * Errors are reported in input order, except that duplicate member names are detected when
 * their object closes (the offset then points at the later of the two names). The function is
 * thread-safe and does not depend on the process or thread locale. */
__attribute__((warn_unused_result)) int jcs_canonicalize(const char *in, size_t len, int max_depth,
                                                         char **out, size_t *out_len,
                                                         struct jcs_error *err);

/* Name of an error code, e.g. "duplicate_key"; never NULL. */
const char *jcs_strerror(int code);

/* Writes the ECMAScript Number.prototype.toString form of v (RFC 8785 §3.2.2.3: shortest
 * round-tripping digits, -0 as "0", plain notation for 1e-6 <= |v| < 1e21) to buf,
 * NUL-terminated, and returns its length (at most 25). v must be finite: for NaN or an infinity
 * (or if the C locale object cannot be created, which glibc never fails), buf is set to "" and -1
 * is returned. Exposed for tests and for callers that emit canonical numbers themselves. */
int jcs_format_double(double v, char buf[32]);

#endif
