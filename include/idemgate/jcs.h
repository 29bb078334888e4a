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

/* ---- A parsed document ----
 *
 * One strict parse (the same grammar, limits and errors as jcs_canonicalize, which is this parse
 * followed by jcs_doc_canonical) gives everything the gateway reads from a request body: the
 * canonical form, the client's bytes compacted, and read-only navigation. The document owns all
 * its memory and does not point into the input, which may be freed once jcs_parse returns.
 *
 * Navigation sees every object's members in canonical order (RFC 8785 §3.2.3: sorted by their
 * names as UTF-16 code units), never in the order the client wrote them, and never two members
 * of one name (the parse refuses duplicates). So whatever is read through it, wildcards
 * included, depends only on what the canonical form fingerprints. */

struct jcs_doc;

/* A value in a document; points into it and is valid until jcs_doc_free. NULL means no value. */
struct jcs_node;

enum jcs_type { JCS_NULL, JCS_FALSE, JCS_TRUE, JCS_NUMBER, JCS_STRING, JCS_ARRAY, JCS_OBJECT };

/* Parses in[0..len) as jcs_canonicalize does (same max_depth, same errors and offsets, err may be
 * NULL, in may be NULL only when len is 0) into a new document (*out, freed with jcs_doc_free).
 * In the same pass it copies the input minus the whitespace between tokens (whitespace inside
 * strings is kept): the compacted bytes, see jcs_doc_take_compact. Returns 0, or a negative enum
 * jcs_err with *out NULL. out must not be NULL. Thread-safe and locale-independent. */
__attribute__((warn_unused_result)) int jcs_parse(const char *in, size_t len, int max_depth,
                                                  struct jcs_doc **out, struct jcs_error *err);

/* Frees a document from jcs_parse; NULL is a no-op. */
void jcs_doc_free(struct jcs_doc *doc);

/* Writes the document's RFC 8785 canonical form (exact numbers, see above) to a new malloc'd,
 * NUL-terminated buffer (*out, *out_len without the NUL; the caller frees it). Returns 0, or
 * JCS_ENOMEM with *out NULL and *out_len 0. May be called any number of times. */
__attribute__((warn_unused_result)) int jcs_doc_canonical(const struct jcs_doc *doc, char **out,
                                                          size_t *out_len);

/* Hands the compacted input over to the caller: every number and string spelt, and every member
 * in the order, exactly as the client wrote them, with only the whitespace between tokens gone
 * (what inject_compact gives for the same valid input). Returns a malloc'd, NUL-terminated
 * buffer (*len bytes without the NUL) that the caller frees with free(); the first call takes
 * it, later calls return NULL with *len 0. Navigation and jcs_doc_canonical do not need it. */
char *jcs_doc_take_compact(struct jcs_doc *doc, size_t *len);

/* jcs_doc_canonical without the top-level object's members named in skip (NULL-terminated,
 * compared with their decoded names): a delivery option that does not change what is asked
 * (an LLM's "stream"). A document whose top level is not an object, or an empty skip, is
 * written whole. */
int jcs_doc_canonical_except(const struct jcs_doc *doc, const char *const *skip, char **out,
                             size_t *out_len);

/* The top-level value; never NULL for a document from jcs_parse. */
const struct jcs_node *jcs_doc_root(const struct jcs_doc *doc);

/* The kind of value n is; n must not be NULL. */
enum jcs_type jcs_node_type(const struct jcs_node *n);

/* Elements of an array or members of an object; 0 for any other value and for NULL. */
size_t jcs_node_count(const struct jcs_node *n);

/* Element i of an array, or the value of member i of an object in canonical member order; NULL
 * when i >= jcs_node_count(n) or n is NULL. */
const struct jcs_node *jcs_node_at(const struct jcs_doc *doc, const struct jcs_node *n, size_t i);

/* The value of the member of object n whose decoded name is name[0..len) (compared byte for
 * byte, case-sensitively; name may hold NUL bytes), or NULL when there is none or n is not an
 * object. O(log members). */
const struct jcs_node *jcs_node_member(const struct jcs_doc *doc, const struct jcs_node *n,
                                       const char *name, size_t len);

/* A number's nearest IEEE double (read in the C locale, whatever the process locale): 0 with *v
 * set, or -1 when n is not a number. Never allocates. */
int jcs_node_number(const struct jcs_doc *doc, const struct jcs_node *n, double *v);

/* A string's decoded UTF-8 bytes (*len of them, not NUL-terminated, possibly holding NUL bytes),
 * pointing into the document; NULL when n is not a string. */
const char *jcs_node_string(const struct jcs_doc *doc, const struct jcs_node *n, size_t *len);

/* Name of an error code, e.g. "duplicate_key"; never NULL. */
const char *jcs_strerror(int code);

/* Writes the ECMAScript Number.prototype.toString form of v (RFC 8785 §3.2.2.3: shortest
 * round-tripping digits, -0 as "0", plain notation for 1e-6 <= |v| < 1e21) to buf,
 * NUL-terminated, and returns its length (at most 25). v must be finite: for NaN or an infinity
 * (or if the C locale object cannot be created, which glibc never fails), buf is set to "" and -1
 * is returned. Exposed for tests and for callers that emit canonical numbers themselves. */
int jcs_format_double(double v, char buf[32]);

#endif
