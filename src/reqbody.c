#include "idemgate/reqbody.h"

#include "idemgate/inject.h"
#include "idemgate/jpath.h"

#include <stdlib.h>
#include <string.h>

/* Design: jcs_parse does the one pass over the client's bytes; everything else here reads the
 * document it leaves (canonical writer, member lookups, a path walk), never the bytes again. */

/* ---- The document as a tree for jpath ---- */

static enum jpath_kind doc_kind(const void *tree, const void *node)
{
    (void)tree;
    enum jcs_type t = jcs_node_type(node);
    return t == JCS_ARRAY ? JPATH_ARRAY : t == JCS_OBJECT ? JPATH_OBJECT : JPATH_SCALAR;
}

static size_t doc_count(const void *tree, const void *node)
{
    (void)tree;
    return jcs_node_count(node);
}

static const void *doc_child(const void *tree, const void *node, size_t i, const void *prev)
{
    (void)prev; /* children are indexed: the hint buys nothing */
    return jcs_node_at(tree, node, i);
}

static const void *doc_member(const void *tree, const void *node, const char *name)
{
    return jcs_node_member(tree, node, name, strlen(name));
}

static const struct jpath_tree doc_tree = {doc_kind, doc_count, doc_child, doc_member};

const struct jcs_node *reqbody_path_first(const struct jpath *p, const struct jcs_doc *doc)
{
    return jpath_first_in(p, &doc_tree, doc, jcs_doc_root(doc));
}

/* ---- What the intake asks ---- */

/* inject_check's answer for field, from the document: the same checks in the same order, where
 * the ones about well-formed JSON have already passed (and the parse refused repeated names). */
static int placeable(const struct jcs_doc *doc, const char *field)
{
    const struct jcs_node *obj = jcs_doc_root(doc);
    struct inject_field f;

    if (!field)
        return INJECT_OK;
    if (inject_field_split(field, &f))
        return INJECT_EFIELD;
    if (jcs_node_type(obj) != JCS_OBJECT)
        return INJECT_ENOTOBJECT;
    if (f.parent) {
        obj = jcs_node_member(doc, obj, f.parent, f.plen);
        if (!obj)
            return INJECT_OK; /* the parent is created with the member */
        if (jcs_node_type(obj) != JCS_OBJECT)
            return INJECT_EPARENT;
    }
    return jcs_node_member(doc, obj, f.name, f.nlen) ? INJECT_EEXISTS : INJECT_OK;
}

/* A count written as a string ("4"): APIs that coerce their parameters (pydantic's, fal's and
 * Replicate's) read it as the number, so it is priced as that number — as pydantic reads an
 * integer: ASCII white space around it, a leading '+', decimal digits with single underscores
 * between them ("1_0"), and a fraction of zeros ("4.0", "4."). -1 otherwise. */
double reqbody_count_in_string(const char *s, size_t len)
{
    while (len && (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n'))
        s++, len--;
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\t' || s[len - 1] == '\r' ||
                   s[len - 1] == '\n'))
        len--;
    if (len && *s == '+')
        s++, len--;
    double v = 0;
    size_t i = 0, digits = 0;
    for (; i < len && s[i] != '.'; i++) {
        if (s[i] == '_' && i > 0 && i + 1 < len && s[i - 1] >= '0' && s[i - 1] <= '9' &&
            s[i + 1] >= '0' && s[i + 1] <= '9')
            continue;
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
        digits++;
        if (v > 1e6)
            return -1;
    }
    if (!digits)
        return -1;
    for (i = i < len ? i + 1 : i; i < len; i++) /* a fraction of zeros only */
        if (s[i] != '0')
            return -1;
    return v;
}

static int requested_count(const struct jcs_doc *doc, const struct reqbody_needs *needs)
{
    double v;
    size_t len;
    const char *s;

    if (!needs->outputs_counted)
        return -1;
    const struct jcs_node *n = reqbody_path_first(needs->outputs_path, doc);
    if (!n)
        return needs->outputs_default;
    if (jcs_node_number(doc, n, &v) < 0)
        v = (s = jcs_node_string(doc, n, &len)) ? reqbody_count_in_string(s, len) : -1;
    if (v >= 1 && v <= 1000)
        return (int)v;
    return needs->outputs_default;
}

int reqbody_init(struct reqbody *b, const char *in, size_t len, const struct reqbody_needs *needs,
                 struct jcs_error *err)
{
    struct jcs_error local;
    struct jcs_doc *doc;

    memset(b, 0, sizeof *b);
    b->requested = -1;
    if (!err)
        err = &local;
    int rc = jcs_parse(in, len, needs->max_depth, &doc, err);
    if (rc)
        return rc;
    rc = needs->fp_skip ? jcs_doc_canonical_except(doc, needs->fp_skip, &b->canon, &b->canon_len)
                        : jcs_doc_canonical(doc, &b->canon, &b->canon_len);
    if (rc) {
        *err = (struct jcs_error){.code = JCS_ENOMEM, .offset = len, .what = "out of memory"};
        jcs_doc_free(doc);
        return rc;
    }
    b->sent = jcs_doc_take_compact(doc, &b->sent_len);
    b->placeable = placeable(doc, needs->client_ref_field);
    b->requested = requested_count(doc, needs);
    jcs_doc_free(doc);
    return 0;
}

void reqbody_fini(struct reqbody *b)
{
    free(b->canon);
    free(b->sent);
    memset(b, 0, sizeof *b);
    b->requested = -1;
}
