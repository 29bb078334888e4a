#include "idemgate/jpath.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Design: compiling turns the text into a fixed array of at most JPATH_MAX_STEPS steps, with the
 * decoded member names NUL-terminated in one buffer allocated together with the struct (cJSON's
 * lookup wants NUL-terminated names, and one allocation keeps jpath_free trivial). Evaluation
 * follows the steps; only a wildcard fans out, and it does so by recursing on the remaining
 * steps, so the recursion depth is bounded by the number of steps. One walker serves every tree
 * through struct jpath_tree, cJSON's included, and both jpath_first and jpath_each. */

enum step_kind { STEP_MEMBER, STEP_INDEX, STEP_WILDCARD };

struct step {
    enum step_kind kind;
    int index;        /* STEP_INDEX: >= 0 counts from the start, < 0 from the end (-1 = last) */
    const char *name; /* STEP_MEMBER: NUL-terminated, points into jpath.names */
};

struct jpath {
    size_t n_steps;
    struct step steps[JPATH_MAX_STEPS];
    /* Every decoded name takes at most as many bytes, with its NUL, as the text it came from
     * (at least '.' plus one character), so strlen(text) bytes always suffice. */
    char names[];
};

/* The compile error message; thread-local so that compiling on several threads is safe. */
static _Thread_local char err_msg[96];

static int compile_fail(struct jpath *p, const char **err, const char *what, size_t pos)
{
    free(p);
    if (err) {
        snprintf(err_msg, sizeof(err_msg), "%s at offset %zu", what, pos);
        *err = err_msg;
    }
    return -1;
}

/* ASCII classes are spelt out so the result does not depend on the locale. */
static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int is_name_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || is_digit(c) || c == '_' || c == '-';
}

int jpath_compile(const char *text, struct jpath **out, const char **err)
{
    *out = NULL;
    if (!text || text[0] != '$')
        return compile_fail(NULL, err, "path must start with '$'", 0);
    size_t len = strlen(text);
    if (len > SIZE_MAX - sizeof(struct jpath))
        return compile_fail(NULL, err, "out of memory", 0);
    struct jpath *p = malloc(sizeof(*p) + len);
    if (!p)
        return compile_fail(NULL, err, "out of memory", 0);
    p->n_steps = 0;

    size_t i = 1, used = 0;
    while (text[i] != '\0') {
        if (p->n_steps == JPATH_MAX_STEPS)
            return compile_fail(p, err, "too many steps (at most 16)", i);
        struct step *s = &p->steps[p->n_steps];
        if (text[i] == '.') {
            i++;
            if (text[i] == '.')
                return compile_fail(p, err, "recursive descent '..' is not supported", i - 1);
            if (text[i] == '*') {
                s->kind = STEP_WILDCARD;
                i++;
            } else {
                size_t start = i;
                while (is_name_char(text[i]))
                    i++;
                if (i == start)
                    return compile_fail(p, err, "expected member name", i);
                s->kind = STEP_MEMBER;
                s->name = p->names + used;
                memcpy(p->names + used, text + start, i - start);
                used += i - start;
                p->names[used++] = '\0';
            }
        } else if (text[i] == '[') {
            size_t open = i++;
            if (text[i] == '*') {
                s->kind = STEP_WILDCARD;
                i++;
            } else if (text[i] == '\'' || text[i] == '"') {
                char quote = text[i++];
                char *name = p->names + used;
                size_t k = 0;
                for (;;) {
                    char c = text[i];
                    if (c == '\0')
                        return compile_fail(p, err, "unterminated quoted name", open + 1);
                    if (c == quote) {
                        i++;
                        break;
                    }
                    if (c == '\\') {
                        c = text[i + 1];
                        if (c != '\'' && c != '"' && c != '\\')
                            return compile_fail(p, err, "invalid escape in quoted name", i);
                        i++;
                    }
                    name[k++] = c;
                    i++;
                }
                if (k == 0)
                    return compile_fail(p, err, "empty member name", open + 1);
                name[k] = '\0';
                used += k + 1;
                s->kind = STEP_MEMBER;
                s->name = name;
            } else if (text[i] == '-' || is_digit(text[i])) {
                int negative = text[i] == '-';
                if (negative)
                    i++;
                size_t start = i;
                if (!is_digit(text[i]))
                    return compile_fail(p, err, "expected index digits", i);
                if (text[i] == '0' && is_digit(text[i + 1]))
                    return compile_fail(p, err, "leading zero in index", i);
                if (negative && text[i] == '0')
                    return compile_fail(p, err, "index -0 is not allowed", start - 1);
                long v = 0;
                while (is_digit(text[i])) {
                    v = v * 10 + (text[i] - '0');
                    if (v > INT_MAX)
                        return compile_fail(p, err, "index too large", start);
                    i++;
                }
                s->kind = STEP_INDEX;
                s->index = negative ? -(int)v : (int)v;
            } else if (text[i] == '\0') {
                return compile_fail(p, err, "unterminated '['", open);
            } else {
                return compile_fail(p, err, "expected quoted name, index or '*'", i);
            }
            if (text[i] == '\0')
                return compile_fail(p, err, "unterminated '['", open);
            if (text[i] != ']')
                return compile_fail(p, err, "expected ']'", i);
            i++;
        } else {
            return compile_fail(p, err, "expected '.' or '['", i);
        }
        p->n_steps++;
    }
    *out = p;
    return 0;
}

void jpath_free(struct jpath *p)
{
    free(p);
}

/* ---- Evaluation, over any tree ---- */

/* A walk of the selected nodes: visit(node, arg) is called for each in order and returns nonzero
 * to end the walk there. */
struct walk {
    const struct jpath *p;
    const struct jpath_tree *ops;
    const void *tree;
    int (*visit)(const void *node, void *arg);
    void *arg;
    /* A last wildcard step that meets a scalar: visited through this, or selects nothing when
     * NULL (jpath_each_list). */
    int (*visit_scalar)(const void *node, void *arg);
};

/* Applies a member or index step to node: the one child it names, or NULL. */
static const void *step_one(const struct walk *w, const struct step *s, const void *node)
{
    enum jpath_kind kind = w->ops->kind(w->tree, node);

    if (s->kind == STEP_MEMBER)
        return kind == JPATH_OBJECT ? w->ops->member(w->tree, node, s->name) : NULL;
    if (kind != JPATH_ARRAY)
        return NULL;
    long index = s->index;
    if (index < 0) {
        index += (long)w->ops->count(w->tree, node);
        if (index < 0)
            return NULL;
    }
    return w->ops->child(w->tree, node, (size_t)index, NULL);
}

/* Follows the steps from i on; returns 1 when the visitor ended the walk. */
static int walk_from(const struct walk *w, size_t i, const void *node)
{
    for (; i < w->p->n_steps; i++) {
        const struct step *s = &w->p->steps[i];
        if (s->kind == STEP_WILDCARD) {
            if (w->ops->kind(w->tree, node) == JPATH_SCALAR)
                return w->visit_scalar && i + 1 == w->p->n_steps
                           ? w->visit_scalar(node, w->arg)
                           : 0;
            const void *c = NULL;
            for (size_t k = 0; (c = w->ops->child(w->tree, node, k, c)); k++)
                if (walk_from(w, i + 1, c))
                    return 1;
            return 0;
        }
        node = step_one(w, s, node);
        if (!node)
            return 0;
    }
    return w->visit(node, w->arg);
}

static int visit_first(const void *node, void *arg)
{
    *(const void **)arg = node;
    return 1;
}

const void *jpath_first_in(const struct jpath *p, const struct jpath_tree *ops, const void *tree,
                           const void *root)
{
    const void *found = NULL;
    struct walk w = {p, ops, tree, visit_first, &found, NULL};

    if (p && root)
        walk_from(&w, 0, root);
    return found;
}

/* ---- cJSON ---- */

static enum jpath_kind cj_kind(const void *tree, const void *node)
{
    (void)tree;
    return cJSON_IsArray(node) ? JPATH_ARRAY : cJSON_IsObject(node) ? JPATH_OBJECT : JPATH_SCALAR;
}

static size_t cj_count(const void *tree, const void *node)
{
    (void)tree;
    return (size_t)cJSON_GetArraySize(node);
}

static const void *cj_child(const void *tree, const void *node, size_t i, const void *prev)
{
    (void)tree;
    if (prev)
        return ((const cJSON *)prev)->next;
    const cJSON *c = ((const cJSON *)node)->child;
    while (c && i-- > 0)
        c = c->next;
    return c;
}

static const void *cj_member(const void *tree, const void *node, const char *name)
{
    (void)tree;
    /* The case-sensitive lookup on purpose: cJSON_GetObjectItem ignores case, which would let
     * "ID" find "id". */
    return cJSON_GetObjectItemCaseSensitive(node, name);
}

static const struct jpath_tree cjson_tree = {cj_kind, cj_count, cj_child, cj_member};

const cJSON *jpath_first(const struct jpath *p, const cJSON *root)
{
    return jpath_first_in(p, &cjson_tree, NULL, root);
}

/* jpath_each's callback and count, as a visitor that never ends the walk. */
struct each {
    void (*cb)(const cJSON *node, void *arg);
    void *arg;
    size_t n;
};

static int visit_each(const void *node, void *arg)
{
    struct each *e = arg;
    if (e->cb)
        e->cb(node, e->arg);
    e->n++;
    return 0;
}

size_t jpath_each(const struct jpath *p, const cJSON *root,
                  void (*cb)(const cJSON *node, void *arg), void *arg)
{
    struct each e = {cb, arg, 0};
    struct walk w = {p, &cjson_tree, NULL, visit_each, &e, NULL};

    if (p && root)
        walk_from(&w, 0, root);
    return e.n;
}

/* jpath_each_list's visitor of a scalar met by the last wildcard: a string only. */
static int visit_each_string(const void *node, void *arg)
{
    return cJSON_IsString((const cJSON *)node) ? visit_each(node, arg) : 0;
}

size_t jpath_each_list(const struct jpath *p, const cJSON *root,
                       void (*cb)(const cJSON *node, void *arg), void *arg)
{
    struct each e = {cb, arg, 0};
    struct walk w = {p, &cjson_tree, NULL, visit_each, &e, visit_each_string};

    if (p && root)
        walk_from(&w, 0, root);
    return e.n;
}

const char *jpath_string(const struct jpath *p, const cJSON *root)
{
    const cJSON *node = jpath_first(p, root);
    return node && cJSON_IsString(node) ? node->valuestring : NULL;
}
