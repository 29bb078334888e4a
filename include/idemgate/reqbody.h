#ifndef IDEMGATE_REQBODY_H
#define IDEMGATE_REQBODY_H

#include "idemgate/jcs.h"

#include <stddef.h>

struct jpath;

/* What the intake reads from a client's JSON body, all from one strict parse (jcs_parse): the
 * canonical form that is fingerprinted, the client's own bytes compacted that are stored and
 * sent, whether the provider's client reference can be placed in them, and how many outputs the
 * request asks for. A pure module: no I/O, no configuration of its own. */

/* What the provider profile wants to know about a body. */
struct reqbody_needs {
    int max_depth;                    /* deepest nesting accepted, as for jcs_parse */
    const char *client_ref_field;     /* "name" or "parent.name" to place; NULL: not placed */
    const struct jpath *outputs_path; /* where the count asked for is; NULL: always the default */
    int outputs_default;              /* the count when the path selects no number in 1..1000 */
    int outputs_counted;              /* 0: the provider's outputs are not counted */
    /* Top-level members left out of the canonical (fingerprinted) form: how the answer is
     * delivered, not what is asked (an LLM's "stream"); NULL-terminated, or NULL. */
    const char *const *fp_skip;
};

/* One body as the intake needs it. The caller owns the buffers (see reqbody_fini). */
struct reqbody {
    char *canon; /* RFC 8785 form (exact numbers, see jcs.h), NUL-terminated */
    size_t canon_len;
    char *sent; /* the client's bytes minus whitespace between tokens, NUL-terminated: every
                   number, string and member order exactly as the client wrote them */
    size_t sent_len;
    int placeable; /* INJECT_OK, or what inject_check(sent, sent_len, client_ref_field) returns
                      (INJECT_EFIELD, INJECT_ENOTOBJECT, INJECT_EPARENT, INJECT_EEXISTS); INJECT_OK
                      when client_ref_field is NULL */
    int requested; /* outputs asked for: the number at outputs_path when it is in 1..1000
                      (truncated to an integer), else outputs_default; -1 when not counted */
};

/* Reads in[0..len) (in may be NULL only when len is 0) into *b with one jcs_parse. Returns 0, or
 * a negative enum jcs_err (JCS_ENOMEM when memory ran out, anywhere) with *err filled as
 * jcs_canonicalize fills it (err may be NULL) and *b holding no buffers (canon and sent NULL,
 * requested -1). b and needs must not be NULL.
 *
 * Paths are evaluated over the parsed document, where every object's members are in canonical
 * order: a wildcard over an object meets its members sorted by name, not in the order the client
 * wrote them, so the count depends only on what is fingerprinted. Member names are compared on
 * their decoded value, byte for byte (a name holding \u0000 is its whole self). */
__attribute__((warn_unused_result)) int reqbody_init(struct reqbody *b, const char *in, size_t len,
                                                     const struct reqbody_needs *needs,
                                                     struct jcs_error *err);

/* Frees b's buffers and leaves it as reqbody_init leaves it on failure; also for a zeroed b. */
void reqbody_fini(struct reqbody *b);

/* The first node path p selects in doc (jpath_first's rules, over the document's canonical member
 * order), or NULL when it selects none or p is NULL. doc must not be NULL. Points into doc. */
const struct jcs_node *reqbody_path_first(const struct jpath *p, const struct jcs_doc *doc);

/* The count a string writes as an API that coerces its parameters reads it (pydantic): white
 * space around it, a leading '+', digits with single underscores between them, a fraction of
 * zeros ("4.0"); -1 when it writes none. Pure. */
double reqbody_count_in_string(const char *s, size_t len);

#endif
