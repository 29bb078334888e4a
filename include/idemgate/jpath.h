#ifndef IDEMGATE_JPATH_H
#define IDEMGATE_JPATH_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* A small JSONPath subset over cJSON trees, for provider profiles that say where a value lives in
 * a provider's JSON response. A path is `$` followed by steps:
 *
 *   .name          member of an object; name is one or more of [A-Za-z0-9_-]
 *   ['any name']   member with any non-empty name; "double quotes" work too, and inside the
 *                  quotes \' \" and \\ stand for the character after the backslash
 *   [n]            element n (0-based) of an array; [-1] is the last element, [-2] the one
 *                  before it, and so on
 *   [*] or .*      every element of an array, or every member value of an object, in order
 *
 * Member names are matched case-sensitively, byte for byte. If an object has the same name twice,
 * a .name or ['name'] step selects the first one (a wildcard selects both). A step that does not
 * fit the node it meets (an index into an object, a member of an array, anything below a string)
 * selects nothing; that is not an error. There is no whitespace, recursive descent, slice,
 * union or filter. */

#define JPATH_MAX_STEPS 16

/* A compiled path; immutable once compiled, so one may be shared between threads. */
struct jpath;

/* Compiles text into a new path (*out, freed with jpath_free). Returns 0, or -1 with *out set to
 * NULL and, when err is not NULL, *err set to an English message with the byte offset (0-based)
 * of the problem, e.g. "expected '.' or '[' at offset 5". The message lives in a thread-local
 * buffer that the next failing jpath_compile on the same thread overwrites, so copy it if it must
 * outlive that. Refused: NULL or text not starting with '$', more than JPATH_MAX_STEPS steps,
 * empty names, unterminated brackets or quotes, unknown escapes, indices with a leading zero, -0
 * or above INT_MAX, and anything after the last step. out must not be NULL. */
__attribute__((warn_unused_result)) int jpath_compile(const char *text, struct jpath **out,
                                                      const char **err);

/* Frees a path from jpath_compile; NULL is a no-op. */
void jpath_free(struct jpath *p);

/* Returns the first node (in document order) that p selects in root, or NULL when it selects
 * none or root is NULL. The result points into root. Never allocates; the recursion depth is
 * bounded by the number of wildcard steps (at most JPATH_MAX_STEPS). */
const cJSON *jpath_first(const struct jpath *p, const cJSON *root);

/* Calls cb(node, arg) for every node p selects in root, in document order, and returns how many
 * there were (0 when root is NULL). cb may be NULL to just count. cb must not modify the tree
 * while the walk is running. */
size_t jpath_each(const struct jpath *p, const cJSON *root,
                  void (*cb)(const cJSON *node, void *arg), void *arg);

/* jpath_each for a list a provider writes as one value when it holds one: a last wildcard step
 * that meets a string selects that string (Replicate's `output` is an array of URLs for most
 * models and one URL for others: `$.output[*]` selected nothing there, and a paid task's result
 * read as no outputs). Any other scalar there still selects nothing. */
size_t jpath_each_list(const struct jpath *p, const cJSON *root,
                       void (*cb)(const cJSON *node, void *arg), void *arg);

/* ---- Other trees ----
 *
 * The same evaluation over a tree jpath does not know (the request body's parsed document, say),
 * read through these callbacks. A node is an opaque pointer into the tree, NULL meaning none;
 * `tree` is passed through untouched. The steps mean what they mean for cJSON, except that "in
 * order" is the order in which child() numbers an object's members, and a .name step selects
 * what member() answers. */

enum jpath_kind { JPATH_SCALAR, JPATH_ARRAY, JPATH_OBJECT };

struct jpath_tree {
    enum jpath_kind (*kind)(const void *tree, const void *node);
    /* Elements of an array (only asked of arrays, for negative indices). */
    size_t (*count)(const void *tree, const void *node);
    /* Element i of an array, or the value of member i of an object; NULL past the last. prev is
     * child i - 1 when the caller has just had it (NULL for i == 0 or when it has not): a hint
     * for trees that chain their children. */
    const void *(*child)(const void *tree, const void *node, size_t i, const void *prev);
    /* The value of the object member named name (NUL-terminated, byte for byte), or NULL. */
    const void *(*member)(const void *tree, const void *node, const char *name);
};

/* jpath_first over any tree: the first node p selects in root, or NULL when it selects none or
 * p or root is NULL. Never allocates; the recursion depth is bounded by the number of wildcard
 * steps. jpath_first(p, root) is jpath_first_in with cJSON's callbacks. */
const void *jpath_first_in(const struct jpath *p, const struct jpath_tree *ops, const void *tree,
                           const void *root);

/* Returns the string value of jpath_first(p, root), or NULL when nothing is selected or the node
 * is not a JSON string (numbers, booleans and null are not converted). The result points into
 * root. */
const char *jpath_string(const struct jpath *p, const cJSON *root);

#endif
