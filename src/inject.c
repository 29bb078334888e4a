#include "idemgate/inject.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Design: one forward scan, shared by inject_check() and inject_member() so that both give the
 * same answer on every input. The body's top-level object is read member by member (names
 * decoded and compared with the wanted name as they are read, with no allocation); values are
 * skipped by delimiting strings and brackets. When the field has a parent that is present, its
 * object is read the same way. The scan yields a plan: where to insert, whether a comma must
 * follow, and whether the parent must be created. */

struct plan {
    size_t at;       /* insert before json[at] (just after an object's '{') */
    int comma;       /* the object was not empty: the new member is followed by ',' */
    int make_parent; /* write "parent":{"name":"value"} instead of "name":"value" */
    struct inject_field f;
};

static int is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static size_t skip_ws(const unsigned char *s, size_t len, size_t i)
{
    while (i < len && is_ws(s[i]))
        i++;
    return i;
}

static int hex4(const unsigned char *s)
{
    int v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char c = s[k];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return -1;
        v = v << 4 | d;
    }
    return v;
}

/* Compares decoded bytes, one at a time, with want[0..wlen): *eq stays 1 while they match. */
struct name_cmp {
    const char *want;
    size_t wlen, pos;
    int eq;
};

static void cmp_byte(struct name_cmp *c, unsigned char b)
{
    if (c->eq && c->pos < c->wlen && (unsigned char)c->want[c->pos] == b)
        c->pos++;
    else
        c->eq = 0;
}

static void cmp_cp(struct name_cmp *c, unsigned long cp)
{
    if (cp < 0x80) {
        cmp_byte(c, (unsigned char)cp);
    } else if (cp < 0x800) {
        cmp_byte(c, (unsigned char)(0xC0 | cp >> 6));
        cmp_byte(c, (unsigned char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        cmp_byte(c, (unsigned char)(0xE0 | cp >> 12));
        cmp_byte(c, (unsigned char)(0x80 | (cp >> 6 & 0x3F)));
        cmp_byte(c, (unsigned char)(0x80 | (cp & 0x3F)));
    } else {
        cmp_byte(c, (unsigned char)(0xF0 | cp >> 18));
        cmp_byte(c, (unsigned char)(0x80 | (cp >> 12 & 0x3F)));
        cmp_byte(c, (unsigned char)(0x80 | (cp >> 6 & 0x3F)));
        cmp_byte(c, (unsigned char)(0x80 | (cp & 0x3F)));
    }
}

/* Reads the string whose opening quote is at s[*pi] and leaves *pi after its closing quote.
 * With c non-NULL, its decoded value (JSON escapes, \uXXXX with surrogate pairs, as UTF-8) is
 * compared with c->want. Returns 0, or -1 on a string that is not strict JSON (unterminated, a
 * raw control character, an unknown escape, a lone surrogate). */
static int scan_string(const unsigned char *s, size_t len, size_t *pi, struct name_cmp *c)
{
    struct name_cmp sink = {"", 0, 0, 0};
    size_t i = *pi + 1;

    if (!c)
        c = &sink;
    for (;;) {
        if (i >= len)
            return -1;
        unsigned char b = s[i];
        if (b == '"')
            break;
        if (b < 0x20)
            return -1;
        if (b != '\\') {
            cmp_byte(c, b);
            i++;
            continue;
        }
        if (i + 1 >= len)
            return -1;
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *e = s[i + 1] ? strchr(from, s[i + 1]) : NULL;
        if (e) {
            cmp_byte(c, (unsigned char)to[e - from]);
            i += 2;
            continue;
        }
        if (s[i + 1] != 'u' || len - i < 6)
            return -1;
        int hi = hex4(s + i + 2);
        if (hi < 0 || (hi >= 0xDC00 && hi <= 0xDFFF))
            return -1;
        i += 6;
        if (hi < 0xD800 || hi > 0xDBFF) {
            cmp_cp(c, (unsigned long)hi);
            continue;
        }
        if (len - i < 6 || s[i] != '\\' || s[i + 1] != 'u')
            return -1;
        int lo = hex4(s + i + 2);
        if (lo < 0xDC00 || lo > 0xDFFF)
            return -1;
        i += 6;
        cmp_cp(c, 0x10000 + ((unsigned long)(hi - 0xD800) << 10) + (unsigned long)(lo - 0xDC00));
    }
    *pi = i + 1;
    return 0;
}

/* Bytes of a number or literal token. */
static int is_scalar_byte(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' ||
           c == '+' || c == '-';
}

/* Skips the value starting at s[*pi] (no whitespace before it). Strings are read strictly;
 * containers are only delimited: brackets are counted outside strings, whatever their kind.
 * Returns 0, or -1 when the value is missing or runs past the end. */
static int skip_value(const unsigned char *s, size_t len, size_t *pi)
{
    size_t i = *pi, depth = 0;

    if (i >= len)
        return -1;
    if (s[i] == '"')
        return scan_string(s, len, pi, NULL);
    if (s[i] != '{' && s[i] != '[') {
        while (i < len && is_scalar_byte(s[i]))
            i++;
        if (i == *pi)
            return -1;
        *pi = i;
        return 0;
    }
    while (i < len) {
        unsigned char b = s[i];
        if (b == '"') {
            if (scan_string(s, len, &i, NULL))
                return -1;
            continue;
        }
        if (b == '{' || b == '[') {
            depth++;
        } else if (b == '}' || b == ']') {
            if (--depth == 0) {
                *pi = i + 1;
                return 0;
            }
        }
        i++;
    }
    return -1;
}

/* What scan_object() found. */
struct obj_scan {
    size_t end;     /* index after the closing '}' */
    size_t value;   /* index of the value of the first member named `want` */
    size_t matches; /* members named `want` */
    int empty;
};

/* Reads the object whose '{' is at s[open] member by member, looking for members named
 * want[0..wlen) (decoded names). Returns 0 or INJECT_ESYNTAX. */
static int scan_object(const unsigned char *s, size_t len, size_t open, const char *want,
                       size_t wlen, struct obj_scan *r)
{
    size_t i = skip_ws(s, len, open + 1);

    memset(r, 0, sizeof *r);
    if (i < len && s[i] == '}') {
        r->empty = 1;
        r->end = i + 1;
        return 0;
    }
    for (;;) {
        struct name_cmp c = {want, wlen, 0, 1};
        if (i >= len || s[i] != '"' || scan_string(s, len, &i, &c))
            return INJECT_ESYNTAX;
        i = skip_ws(s, len, i);
        if (i >= len || s[i] != ':')
            return INJECT_ESYNTAX;
        i = skip_ws(s, len, i + 1);
        if (c.eq && c.pos == wlen && r->matches++ == 0)
            r->value = i;
        if (skip_value(s, len, &i))
            return INJECT_ESYNTAX;
        i = skip_ws(s, len, i);
        if (i < len && s[i] == ',') {
            i = skip_ws(s, len, i + 1);
            continue;
        }
        if (i < len && s[i] == '}') {
            r->end = i + 1;
            return 0;
        }
        return INJECT_ESYNTAX;
    }
}

int inject_field_split(const char *field, struct inject_field *f)
{
    memset(f, 0, sizeof *f);
    if (!field)
        return INJECT_EFIELD;
    const char *dot = strchr(field, '.');
    if (!field[0] || (dot && (dot == field || !dot[1] || strchr(dot + 1, '.'))))
        return INJECT_EFIELD;
    if (dot) {
        f->parent = field;
        f->plen = (size_t)(dot - field);
        f->name = dot + 1;
    } else {
        f->name = field;
    }
    f->nlen = strlen(f->name);
    return INJECT_OK;
}

/* The decision shared by inject_check() and inject_member(). */
static int locate(const char *json, size_t len, const char *field, struct plan *pl)
{
    const unsigned char *s = (const unsigned char *)json;
    const struct inject_field *f = &pl->f;
    struct obj_scan top, par;

    memset(pl, 0, sizeof *pl);
    if (inject_field_split(field, &pl->f))
        return INJECT_EFIELD;
    size_t open = skip_ws(s, len, 0);
    if (open >= len || s[open] != '{')
        return INJECT_ENOTOBJECT;
    if (scan_object(s, len, open, f->parent ? f->parent : f->name, f->parent ? f->plen : f->nlen,
                    &top) ||
        skip_ws(s, len, top.end) != len)
        return INJECT_ESYNTAX;
    if (!f->parent) {
        if (top.matches)
            return INJECT_EEXISTS;
        pl->at = open + 1;
        pl->comma = !top.empty;
        return INJECT_OK;
    }
    if (!top.matches) {
        pl->at = open + 1;
        pl->comma = !top.empty;
        pl->make_parent = 1;
        return INJECT_OK;
    }
    /* Strict JSON (what the gateway stores) has no repeated names; with two parents, readers
     * disagree on which one counts, so nothing is placed. */
    if (top.matches > 1)
        return INJECT_ESYNTAX;
    if (s[top.value] != '{')
        return INJECT_EPARENT;
    if (scan_object(s, len, top.value, f->name, f->nlen, &par))
        return INJECT_ESYNTAX;
    if (par.matches)
        return INJECT_EEXISTS;
    pl->at = top.value + 1;
    pl->comma = !par.empty;
    return INJECT_OK;
}

int inject_check(const char *json, size_t len, const char *field)
{
    struct plan pl;
    return locate(json, len, field, &pl);
}

/* Length of s[0..n) written as a JSON string, quotes included; with out non-NULL, writes it. */
static size_t put_string(char *out, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;

    if (out)
        out[o] = '"';
    o++;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[6];
        size_t el = 0;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            el = 2;
        } else if (c < 0x20) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            el = 6;
        } else {
            esc[0] = (char)c;
            el = 1;
        }
        if (out)
            memcpy(out + o, esc, el);
        o += el;
    }
    if (out)
        out[o] = '"';
    return o + 1;
}

/* Length of the inserted text; with out non-NULL, writes it. */
static size_t put_insert(char *out, const struct plan *pl, const char *value, size_t vlen)
{
    size_t o = 0;

    if (pl->make_parent) {
        o += put_string(out ? out + o : NULL, pl->f.parent, pl->f.plen);
        if (out)
            memcpy(out + o, ":{", 2);
        o += 2;
    }
    o += put_string(out ? out + o : NULL, pl->f.name, pl->f.nlen);
    if (out)
        out[o] = ':';
    o++;
    o += put_string(out ? out + o : NULL, value, vlen);
    if (pl->make_parent) {
        if (out)
            out[o] = '}';
        o++;
    }
    if (pl->comma) {
        if (out)
            out[o] = ',';
        o++;
    }
    return o;
}

int inject_member(const char *json, size_t len, const char *field, const char *value, char **out,
                  size_t *out_len)
{
    struct plan pl;

    *out = NULL;
    *out_len = 0;
    int rc = locate(json, len, field, &pl);
    if (rc)
        return rc;
    size_t vlen = strlen(value);
    size_t il = put_insert(NULL, &pl, value, vlen);
    if (il > SIZE_MAX - len - 1)
        return INJECT_ENOMEM;
    char *b = malloc(len + il + 1);
    if (!b)
        return INJECT_ENOMEM;
    memcpy(b, json, pl.at);
    put_insert(b + pl.at, &pl, value, vlen);
    memcpy(b + pl.at + il, json + pl.at, len - pl.at);
    b[len + il] = '\0';
    *out = b;
    *out_len = len + il;
    return INJECT_OK;
}

const char *inject_strerror(int code)
{
    switch (code) {
    case INJECT_OK:
        return "ok";
    case INJECT_ENOMEM:
        return "out_of_memory";
    case INJECT_ENOTOBJECT:
        return "body_not_object";
    case INJECT_EEXISTS:
        return "member_exists";
    case INJECT_EPARENT:
        return "parent_not_object";
    case INJECT_EFIELD:
        return "invalid_field";
    case INJECT_ESYNTAX:
        return "invalid_json";
    default:
        return "unknown_error";
    }
}

int inject_compact(const char *json, size_t len, char **out, size_t *out_len)
{
    char *b = malloc(len + 1);
    size_t n = 0;
    int in_string = 0;
    if (!b)
        return -1;
    for (size_t i = 0; i < len; i++) {
        char c = json[i];
        if (in_string) {
            b[n++] = c;
            if (c == '\\' && i + 1 < len)
                b[n++] = json[++i];
            else if (c == '"')
                in_string = 0;
        } else if (c == '"') {
            in_string = 1;
            b[n++] = c;
        } else if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            b[n++] = c;
        }
    }
    b[n] = '\0';
    *out = b;
    *out_len = n;
    return 0;
}
