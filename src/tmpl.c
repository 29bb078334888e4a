#include "idemgate/tmpl.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Design: one scanner serves both entry points. tmpl_expand gives it an output buffer;
 * tmpl_validate gives it none and a lookup that answers from the allowed list, so the two can
 * never disagree about the syntax. */

/* Unknown names are quoted in messages up to this length, so one long name cannot crowd out the
 * rest of the message. */
#define NAME_IN_MSG_MAX 64

/* A growing output string. An allocation failure is remembered and checked once at the end. */
struct obuf {
    char *data;
    size_t len, cap;
    int oom;
};

static void obuf_put(struct obuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (n >= SIZE_MAX - b->len) {
        b->oom = 1;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1)
            cap = cap > SIZE_MAX / 2 ? b->len + n + 1 : cap * 2;
        char *data = realloc(b->data, cap);
        if (!data) {
            b->oom = 1;
            return;
        }
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

__attribute__((format(printf, 3, 4))) static int fail(char *errbuf, size_t errlen, const char *fmt,
                                                      ...)
{
    if (errbuf && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errbuf, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* ASCII classes are spelt out so the result does not depend on the locale. */
static int is_alnum(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

static int is_name_char(unsigned char c)
{
    return is_alnum(c) || c == '_' || c == '.';
}

/* RFC 3986 section 2.3. */
static int is_unreserved(unsigned char c)
{
    return is_alnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

static void put_segment(struct obuf *b, const char *v)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *s = (const unsigned char *)v;
    while (*s) {
        size_t run = 0;
        while (s[run] && is_unreserved(s[run]))
            run++;
        obuf_put(b, (const char *)s, run);
        s += run;
        if (*s) {
            char enc[3] = {'%', hex[*s >> 4], hex[*s & 0x0f]};
            obuf_put(b, enc, sizeof(enc));
            s++;
        }
    }
}

/* Scans tmpl; with b not NULL also appends the expansion to b. */
static int scan(const char *tmpl, enum tmpl_escape esc, tmpl_lookup_fn lookup, void *arg,
                struct obuf *b, char *errbuf, size_t errlen)
{
    size_t i = 0;
    while (tmpl[i] != '\0') {
        if (tmpl[i] == '{' && tmpl[i + 1] == '{') {
            if (b)
                obuf_put(b, "{", 1);
            i += 2;
            continue;
        }
        if (tmpl[i] == '}') {
            if (tmpl[i + 1] != '}')
                return fail(errbuf, errlen, "unmatched '}' at offset %zu (write '}}' for a '}')",
                            i);
            if (b)
                obuf_put(b, "}", 1);
            i += 2;
            continue;
        }
        if (tmpl[i] != '{') {
            size_t run = strcspn(tmpl + i, "{}");
            if (b)
                obuf_put(b, tmpl + i, run);
            i += run;
            continue;
        }

        size_t open = i++;
        while (is_name_char((unsigned char)tmpl[i]))
            i++;
        size_t name_len = i - open - 1;
        const char *name = tmpl + open + 1;
        if (tmpl[i] == '\0')
            return fail(errbuf, errlen, "unterminated '{' at offset %zu", open);
        if (tmpl[i] != '}')
            return fail(errbuf, errlen,
                        "invalid character in placeholder at offset %zu (write '{{' for a '{')", i);
        if (name_len == 0)
            return fail(errbuf, errlen, "empty placeholder name at offset %zu", open);
        i++;

        int shown = (int)(name_len > NAME_IN_MSG_MAX ? NAME_IN_MSG_MAX : name_len);
        const char *v = lookup ? lookup(name, name_len, arg) : NULL;
        if (!v)
            return fail(errbuf, errlen, "unknown placeholder '%.*s'", shown, name);
        if (!b)
            continue;
        if (esc == TMPL_URL_SEGMENT) {
            if (v[0] == '\0' || strcmp(v, ".") == 0 || strcmp(v, "..") == 0)
                return fail(errbuf, errlen,
                            "placeholder '%.*s' is empty, '.' or '..', which a URL path "
                            "segment cannot be",
                            shown, name);
            put_segment(b, v);
        } else {
            obuf_put(b, v, strlen(v));
        }
    }
    return 0;
}

int tmpl_expand(const char *tmpl, enum tmpl_escape esc, tmpl_lookup_fn lookup, void *arg,
                char **out, char *errbuf, size_t errlen)
{
    *out = NULL;
    if (!tmpl)
        return fail(errbuf, errlen, "no template");
    if (esc != TMPL_RAW && esc != TMPL_URL_SEGMENT)
        return fail(errbuf, errlen, "invalid escape mode %d", (int)esc);

    struct obuf b = {0};
    /* An empty result still needs its NUL, so the buffer exists even with nothing appended. */
    obuf_put(&b, "", 0);
    if (scan(tmpl, esc, lookup, arg, &b, errbuf, errlen) != 0) {
        free(b.data);
        return -1;
    }
    if (b.oom) {
        free(b.data);
        return fail(errbuf, errlen, "out of memory");
    }
    *out = b.data;
    return 0;
}

/* The lookup of tmpl_validate: any non-NULL value means "known". */
static const char *allowed_lookup(const char *name, size_t name_len, void *arg)
{
    const char *const *allowed = arg;
    for (size_t k = 0; allowed && allowed[k]; k++) {
        if (strlen(allowed[k]) == name_len && memcmp(allowed[k], name, name_len) == 0)
            return "";
    }
    return NULL;
}

int tmpl_validate(const char *tmpl, const char *const *allowed, char *errbuf, size_t errlen)
{
    if (!tmpl)
        return fail(errbuf, errlen, "no template");
    return scan(tmpl, TMPL_RAW, allowed_lookup, (void *)allowed, NULL, errbuf, errlen);
}
