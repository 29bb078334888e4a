#include "idemgate/members.h"

#include <stdio.h>
#include <string.h>

#define NAME_MAX_CMP 64

size_t memb_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), extra = 0;
    /* Beyond NAME_MAX_CMP bytes only the lengths are compared: no valid name is that long, so
     * such a name is far from every one anyway. */
    if (la > NAME_MAX_CMP || lb > NAME_MAX_CMP) {
        size_t ca = la > NAME_MAX_CMP ? NAME_MAX_CMP : la, cb = lb > NAME_MAX_CMP ? NAME_MAX_CMP : lb;
        extra = (la - ca > lb - cb) ? (la - ca) - (lb - cb) : (lb - cb) - (la - ca);
        la = ca;
        lb = cb;
    }
    /* Three rows of the dynamic programme: i - 2, i - 1 and i. */
    size_t r0[NAME_MAX_CMP + 1], r1[NAME_MAX_CMP + 1], r2[NAME_MAX_CMP + 1];
    size_t *pp = r0, *prev = r1, *cur = r2;
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t cost = a[i - 1] != b[j - 1];
            size_t best = prev[j] + 1; /* deletion */
            if (cur[j - 1] + 1 < best)
                best = cur[j - 1] + 1; /* insertion */
            if (prev[j - 1] + cost < best)
                best = prev[j - 1] + cost; /* substitution */
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                pp[j - 2] + 1 < best)
                best = pp[j - 2] + 1; /* transposition */
            cur[j] = best;
        }
        size_t *t = pp;
        pp = prev;
        prev = cur;
        cur = t;
    }
    return prev[lb] + extra;
}

static int equal_ignoring_case(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        char x = (*a >= 'A' && *a <= 'Z') ? (char)(*a - 'A' + 'a') : *a;
        char y = (*b >= 'A' && *b <= 'Z') ? (char)(*b - 'A' + 'a') : *b;
        if (x != y)
            return 0;
    }
    return *a == *b;
}

/* One name is a prefix of the other, the shorter of at least 3 bytes. */
static int prefix_related(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t shorter = la < lb ? la : lb;
    return shorter >= 3 && strncmp(a, b, shorter) == 0;
}

const char *memb_nearest(const char *name, const struct memb_table *t)
{
    size_t len = strlen(name);
    size_t limit = (len > 3 ? len : 3) / 3;
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (; t; t = t->also) {
        for (size_t i = 0; i < t->n; i++) {
            const char *cand = t->m[i].name;
            size_t d = equal_ignoring_case(name, cand) ? 0 : memb_distance(name, cand);
            int close = d <= limit || prefix_related(name, cand);
            if (close && d < best_d) {
                best = cand;
                best_d = d;
            }
        }
    }
    return best;
}

static const struct memb *find(const struct memb_table *t, const char *name)
{
    for (; t; t = t->also)
        for (size_t i = 0; i < t->n; i++)
            if (strcmp(t->m[i].name, name) == 0)
                return &t->m[i];
    return NULL;
}

/* prefix followed by the member name: `.name` (no dot at the root) when name is made of
 * [A-Za-z0-9_-], else `['name']` with ' and \ escaped and control bytes shown as '?' (the same
 * spelling a profile's JSONPaths use). */
static void join_name(char *out, size_t len, const char *prefix, const char *name)
{
    int plain = *name != '\0';
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '-'))
            plain = 0;
    if (plain) {
        snprintf(out, len, "%s%s%s", prefix, *prefix ? "." : "", name);
        return;
    }
    size_t pos = (size_t)snprintf(out, len, "%s['", prefix);
    for (const char *c = name; *c && pos + 4 < len; c++) {
        if (*c == '\'' || *c == '\\')
            out[pos++] = '\\';
        out[pos++] = ((unsigned char)*c < 0x20 || *c == 0x7f) ? '?' : *c;
    }
    if (pos + 3 <= len)
        snprintf(out + pos, len - pos, "']");
}

/* The first member of object o named like an earlier one, or NULL. */
static const cJSON *first_duplicate(const cJSON *o)
{
    for (const cJSON *a = o->child; a; a = a->next)
        for (const cJSON *b = o->child; b != a; b = b->next)
            if (a->string && b->string && strcmp(a->string, b->string) == 0)
                return a;
    return NULL;
}

static int fail(struct memb_problem *p, enum memb_problem_kind kind, const char *path,
                const char *suggest)
{
    p->kind = kind;
    snprintf(p->path, sizeof(p->path), "%s", path);
    p->suggest = suggest;
    return -1;
}

static int check_value(const cJSON *v, const struct memb *m, const char *path,
                       struct memb_problem *p);

int memb_check(const cJSON *o, const struct memb_table *t, const char *prefix,
               struct memb_problem *p)
{
    char path[sizeof(p->path)];
    p->kind = MEMB_OK;
    p->path[0] = '\0';
    p->suggest = NULL;
    if (!cJSON_IsObject(o))
        return 0;
    const cJSON *dup = first_duplicate(o);
    for (const cJSON *v = o->child; v; v = v->next) {
        const char *name = v->string ? v->string : "";
        join_name(path, sizeof(path), prefix, name);
        if (v == dup)
            return fail(p, MEMB_DUPLICATE, path, NULL);
        const struct memb *m = find(t, name);
        if (!m)
            return fail(p, MEMB_UNKNOWN, path, memb_nearest(name, t));
        if (check_value(v, m, path, p) < 0)
            return -1;
    }
    return 0;
}

/* The inside of member m's value v, at path. */
static int check_value(const cJSON *v, const struct memb *m, const char *path,
                       struct memb_problem *p)
{
    char here[sizeof(p->path)];
    switch (m->kind) {
    case MEMB_OBJECT:
        return memb_check(v, m->sub, path, p);
    case MEMB_ARRAY: {
        if (!cJSON_IsArray(v))
            return 0;
        size_t i = 0;
        for (const cJSON *e = v->child; e; e = e->next, i++) {
            /* A path cut to 200 bytes still leaves room for any index. */
            snprintf(here, sizeof(here), "%.200s[%zu]", path, i);
            if (memb_check(e, m->sub, here, p) < 0)
                return -1;
        }
        return 0;
    }
    case MEMB_MAP: {
        if (!cJSON_IsObject(v))
            return 0;
        const cJSON *dup = first_duplicate(v);
        for (const cJSON *e = v->child; e; e = e->next) {
            join_name(here, sizeof(here), path, e->string ? e->string : "");
            if (e == dup)
                return fail(p, MEMB_DUPLICATE, here, NULL);
            if (memb_check(e, m->sub, here, p) < 0)
                return -1;
        }
        return 0;
    }
    case MEMB_VALUE:
        break;
    }
    return 0;
}

void memb_message(const struct memb_problem *p, char *buf, size_t len)
{
    if (p->kind == MEMB_DUPLICATE)
        snprintf(buf, len, "duplicate member %s", p->path);
    else if (p->kind == MEMB_UNKNOWN && p->suggest)
        snprintf(buf, len, "unknown member %s (did you mean \"%s\"?)", p->path, p->suggest);
    else if (p->kind == MEMB_UNKNOWN)
        snprintf(buf, len, "unknown member %s", p->path);
    else
        snprintf(buf, len, "no problem");
}
