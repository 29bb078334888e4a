/* multipart/form-data: the boundary, a strict reading, the canonical form and the text fields
 * (multipart.h). */
#include "idemgate/multipart.h"

#include "idemgate/crypto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int is_bchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("'()+_,-./:=? ", c) != NULL); /* strchr finds the terminator too */
}

static int is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static int boundary_ok(const char *b, size_t n)
{
    if (n < 1 || n > MP_BOUNDARY_MAX || b[n - 1] == ' ')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!is_bchar((unsigned char)b[i]))
            return 0;
    return 1;
}

static const char *skip_ows(const char *s, const char *end)
{
    while (s < end && (*s == ' ' || *s == '\t'))
        s++;
    return s;
}

/* One parameter `; name=value` of a header value at *s (< end): the name in [*n, *n + *nl), the
 * value raw in [*v, *v + *vl) (a quoted string without its quotes, escapes left in), *quoted 1
 * when it was one. Returns 1, 0 at the end of the value, -1 when malformed. */
static int next_param(const char **s, const char *end, const char **n, size_t *nl,
                      const char **v, size_t *vl, int *quoted)
{
    const char *p = skip_ows(*s, end);
    if (p == end)
        return 0;
    if (*p != ';')
        return -1;
    p = skip_ows(p + 1, end);
    const char *name = p;
    while (p < end && is_tchar((unsigned char)*p))
        p++;
    if (p == name || p == end || *p != '=')
        return -1;
    *n = name;
    *nl = (size_t)(p - name);
    p++;
    if (p < end && *p == '"') {
        const char *q = ++p;
        while (q < end && *q != '"') {
            if (*q == '\\' && q + 1 < end)
                q++;
            q++;
        }
        if (q == end)
            return -1;
        *v = p;
        *vl = (size_t)(q - p);
        *quoted = 1;
        p = q + 1;
    } else {
        const char *q = p;
        while (q < end && is_tchar((unsigned char)*q))
            q++;
        if (q == p)
            return -1;
        *v = p;
        *vl = (size_t)(q - p);
        *quoted = 0;
        p = q;
    }
    *s = p;
    return 1;
}

int mp_boundary(const char *content_type, char out[MP_BOUNDARY_MAX + 1])
{
    static const char type[] = "multipart/form-data";
    if (!content_type || strncasecmp(content_type, type, sizeof(type) - 1) != 0)
        return -1;
    const char *s = content_type + sizeof(type) - 1, *end = s + strlen(s);
    const char *n, *v;
    size_t nl, vl;
    int quoted, r, found = -1;
    while ((r = next_param(&s, end, &n, &nl, &v, &vl, &quoted)) == 1) {
        if (nl != 8 || strncasecmp(n, "boundary", 8) != 0)
            continue;
        if (found >= 0)
            return -1; /* two boundaries: which one the provider reads is anybody's guess */
        size_t k = 0;
        for (size_t i = 0; i < vl; i++) {
            if (quoted && v[i] == '\\' && i + 1 < vl)
                i++;
            if (k == MP_BOUNDARY_MAX)
                return -1;
            out[k++] = v[i];
        }
        out[k] = '\0';
        if (!boundary_ok(out, k))
            return -1;
        found = (int)k;
    }
    return r < 0 ? -1 : found;
}

static void say(char *why, size_t whylen, const char *what)
{
    if (why && whylen)
        snprintf(why, whylen, "%s", what);
}

/* The headers of one part, [s, end): each line ends in CRLF (the blank line is not in it). */
static int read_part_headers(const char *s, const char *end, struct mp_part *pt, char *why,
                             size_t whylen)
{
    int disposition = 0;
    while (s < end) {
        const char *eol = memmem(s, (size_t)(end - s), "\r\n", 2);
        if (!eol)
            eol = end;
        const char *colon = memchr(s, ':', (size_t)(eol - s));
        const char *p = s;
        while (p < eol && is_tchar((unsigned char)*p))
            p++;
        if (!colon || p != colon || p == s) {
            say(why, whylen, "a part has a malformed header line");
            return -1;
        }
        size_t hl = (size_t)(colon - s);
        const char *v = skip_ows(colon + 1, eol), *ve = eol;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        for (const char *c = v; c < ve; c++)
            if ((unsigned char)*c < 0x20 && *c != '\t') {
                say(why, whylen, "a part's header holds a control character");
                return -1;
            }
        if (hl == 19 && strncasecmp(s, "Content-Disposition", 19) == 0) {
            if (disposition++) {
                say(why, whylen, "a part has two Content-Disposition headers");
                return -1;
            }
            if ((size_t)(ve - v) < 9 || strncasecmp(v, "form-data", 9) != 0 ||
                (v + 9 < ve && v[9] != ';' && v[9] != ' ' && v[9] != '\t')) {
                say(why, whylen, "a part's Content-Disposition is not form-data");
                return -1;
            }
            const char *q = v + 9, *pn, *pv;
            size_t pnl, pvl;
            int quoted, r, named = 0;
            while ((r = next_param(&q, ve, &pn, &pnl, &pv, &pvl, &quoted)) == 1) {
                if (pnl == 4 && strncasecmp(pn, "name", 4) == 0 && !named++) {
                    pt->name = pv;
                    pt->name_len = pvl;
                } else if (pnl == 8 && strncasecmp(pn, "filename", 8) == 0 && !pt->filename) {
                    pt->filename = pv;
                    pt->filename_len = pvl;
                } else {
                    say(why, whylen,
                        "a part's Content-Disposition has a parameter other than one name and "
                        "one filename");
                    return -1;
                }
            }
            if (r < 0 || !named) {
                say(why, whylen, "a part's Content-Disposition has no well-formed name");
                return -1;
            }
        } else if (hl == 12 && strncasecmp(s, "Content-Type", 12) == 0) {
            if (pt->ctype || v == ve) {
                say(why, whylen, "a part has two Content-Type headers, or an empty one");
                return -1;
            }
            pt->ctype = v;
            pt->ctype_len = (size_t)(ve - v);
        } else {
            say(why, whylen,
                "a part has a header other than Content-Disposition and Content-Type");
            return -1;
        }
        s = eol == end ? end : eol + 2;
    }
    if (!disposition) {
        say(why, whylen, "a part has no Content-Disposition");
        return -1;
    }
    return 0;
}

int mp_parse(const char *body, size_t len, const char *boundary, struct mp_part *parts,
             size_t max, size_t *n, char *why, size_t whylen)
{
    char delim[MP_BOUNDARY_MAX + 5];
    size_t bl = boundary ? strlen(boundary) : 0;
    *n = 0;
    if (!boundary_ok(boundary ? boundary : "", bl)) {
        say(why, whylen, "the boundary is malformed");
        return -1;
    }
    /* "\r\n--" boundary: the delimiter inside the body; the first has no CRLF before it. */
    int dl = snprintf(delim, sizeof(delim), "\r\n--%s", boundary);
    const char *end = body + len;
    if (len < (size_t)dl - 2 || memcmp(body, delim + 2, (size_t)dl - 2) != 0) {
        say(why, whylen, "the body does not begin with its boundary's delimiter");
        return -1;
    }
    const char *s = body + dl - 2;
    for (;;) {
        if (end - s >= 2 && s[0] == '-' && s[1] == '-') {
            s += 2;
            if (!(s == end || (end - s == 2 && s[0] == '\r' && s[1] == '\n'))) {
                say(why, whylen, "something follows the closing delimiter");
                return -1;
            }
            if (*n == 0) {
                say(why, whylen, "the body has no part");
                return -1;
            }
            return 0;
        }
        if (end - s < 2 || s[0] != '\r' || s[1] != '\n') {
            say(why, whylen, "a delimiter is not followed by CRLF");
            return -1;
        }
        s += 2;
        if (*n == max) {
            say(why, whylen, "the body has too many parts");
            return -1;
        }
        struct mp_part *pt = &parts[*n];
        memset(pt, 0, sizeof(*pt));
        const char *hend;
        if (end - s >= 2 && s[0] == '\r' && s[1] == '\n')
            hend = s; /* no header at all: refused below */
        else {
            const char *b = memmem(s, (size_t)(end - s), "\r\n\r\n", 4);
            if (!b) {
                say(why, whylen, "a part's headers do not end");
                return -1;
            }
            hend = b;
        }
        if (memchr(s, '\0', (size_t)(hend - s))) {
            say(why, whylen, "a part's header holds a NUL byte");
            return -1;
        }
        if (read_part_headers(s, hend, pt, why, whylen) < 0)
            return -1;
        const char *data = hend + (hend == s ? 2 : 4);
        const char *next = data <= end ? memmem(data, (size_t)(end - data), delim, (size_t)dl)
                                       : NULL;
        if (!next) {
            say(why, whylen, "a part does not end with a delimiter");
            return -1;
        }
        /* The boundary inside a part's content, where a lenient reader takes it for a delimiter
         * (at the content's start, after the headers' blank line; after a bare LF): other
         * parts, hidden from the fingerprint and the price, for a provider that reads it so.
         * A sender picks a boundary its content does not hold (RFC 2046 §5.1.1). */
        if (((size_t)(next - data) >= (size_t)dl - 2 && !memcmp(data, delim + 2, (size_t)dl - 2)) ||
            memmem(data, (size_t)(next - data), delim + 1, (size_t)dl - 1)) {
            say(why, whylen, "a part's content holds its boundary");
            return -1;
        }
        pt->data = data;
        pt->data_len = (size_t)(next - data);
        (*n)++;
        s = next + dl;
    }
}

/* Appends a netstring "<len>:<bytes>," or "-" for NULL to buf at *o. */
static void put_netstring(char *buf, size_t *o, const char *s, size_t l)
{
    if (!s) {
        buf[(*o)++] = '-';
        return;
    }
    *o += (size_t)sprintf(buf + *o, "%zu:", l);
    memcpy(buf + *o, s, l);
    *o += l;
    buf[(*o)++] = ',';
}

static int by_name(const struct mp_part *a, const struct mp_part *b)
{
    size_t l = a->name_len < b->name_len ? a->name_len : b->name_len;
    int c = memcmp(a->name, b->name, l);
    if (c)
        return c;
    return a->name_len < b->name_len ? -1 : a->name_len > b->name_len;
}

char *mp_canonical(const struct mp_part *parts, size_t n, size_t *len)
{
    static const char head[] = "multipart/form-data\n";
    size_t cap = sizeof(head);
    for (size_t i = 0; i < n; i++)
        cap += parts[i].name_len + parts[i].filename_len + parts[i].ctype_len + 3 * 24 +
               CRYPTO_SHA256_HEX + 1;
    char *buf = malloc(cap);
    size_t *order = malloc((n ? n : 1) * sizeof(*order));
    if (!buf || !order) {
        free(buf);
        free(order);
        return NULL;
    }
    /* A stable insertion sort by name: parts of one name keep the client's order. */
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        while (j > 0 && by_name(&parts[order[j - 1]], &parts[i]) > 0) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    size_t o = sizeof(head) - 1;
    memcpy(buf, head, o);
    for (size_t k = 0; k < n; k++) {
        const struct mp_part *pt = &parts[order[k]];
        char hex[CRYPTO_SHA256_HEX];
        put_netstring(buf, &o, pt->name, pt->name_len);
        put_netstring(buf, &o, pt->filename, pt->filename_len);
        put_netstring(buf, &o, pt->ctype, pt->ctype_len);
        crypto_sha256_hex(pt->data, pt->data_len, hex);
        memcpy(buf + o, hex, CRYPTO_SHA256_HEX - 1);
        o += CRYPTO_SHA256_HEX - 1;
        buf[o++] = '\n';
    }
    buf[o] = '\0';
    free(order);
    *len = o;
    return buf;
}

/* Whether s[0..n) is UTF-8 (no overlong form, no surrogate) without a control character. */
static int plain_utf8(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        if (c < 0x20 || c == 0x7f)
            return 0;
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc2 ? 1 : 0;
        if (!k || c > 0xf4 || i + k >= n)
            return 0;
        unsigned long cp = c & (0x3f >> k);
        for (size_t j = 1; j <= k; j++) {
            if ((u[i + j] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (u[i + j] & 0x3f);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += k + 1;
    }
    return 1;
}

/* Whether s[0..n) is a JSON number as RFC 8259 writes one. */
static int json_number(const char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-')
        i++;
    if (i < n && s[i] == '0')
        i++;
    else if (i < n && s[i] >= '1' && s[i] <= '9')
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    else
        return 0;
    if (i < n && s[i] == '.') {
        size_t d = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d)
            return 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        size_t d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d)
            return 0;
    }
    return i == n && n <= 64;
}

static size_t put_json_string(char *buf, const char *s, size_t n)
{
    size_t o = 0;
    buf[o++] = '"';
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"' || s[i] == '\\')
            buf[o++] = '\\';
        buf[o++] = s[i];
    }
    buf[o++] = '"';
    return o;
}

/* s[0..*n) without the ASCII white space around it (a form field's value as a provider's number
 * parser may read it): its start, *n its new length. */
static const char *trimmed(const char *s, size_t *n)
{
    while (*n && (s[0] == ' ' || s[0] == '\t' || s[0] == '\r' || s[0] == '\n')) {
        s++;
        (*n)--;
    }
    while (*n && (s[*n - 1] == ' ' || s[*n - 1] == '\t' || s[*n - 1] == '\r' || s[*n - 1] == '\n'))
        (*n)--;
    return s;
}

/* Part p's value as a JSON number (*v, *vn: a view into its data), when it is one once trimmed. */
static int number_of(const struct mp_part *p, const char **v, size_t *vn)
{
    *vn = p->data_len;
    *v = trimmed(p->data, vn);
    return *vn && json_number(*v, *vn);
}

/* Whether parts a and b are text fields of one name. */
static int same_field(const struct mp_part *a, const struct mp_part *b)
{
    return !a->filename && !b->filename && a->name_len == b->name_len &&
           memcmp(a->name, b->name, a->name_len) == 0;
}

/* Whether part p is one of the fields: a text field whose name is UTF-8 without control
 * characters or a backslash (quoted names may hold escapes: left out rather than guessed at),
 * and whose value is a number once trimmed or UTF-8 without control characters. */
static int field_kept(const struct mp_part *p)
{
    const char *v;
    size_t vn;
    return !p->filename && plain_utf8(p->name, p->name_len) &&
           !memchr(p->name, '\\', p->name_len) &&
           (number_of(p, &v, &vn) || plain_utf8(p->data, p->data_len));
}

long mp_ambiguous_field(const struct mp_part *parts, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct mp_part *p = &parts[i];
        if (p->filename)
            continue;
        if (memchr(p->name, '\\', p->name_len))
            return (long)i;
        if (p->name_len >= 2 && memcmp(p->name + p->name_len - 2, "[]", 2) == 0)
            continue; /* a list by its name's convention: repeated on purpose */
        for (size_t j = 0; j < i; j++)
            if (same_field(&parts[j], p))
                return (long)i;
    }
    return -1;
}

long mp_part_under_member(const struct mp_part *parts, size_t n, const char *member)
{
    if (!member)
        return -1;
    size_t seg = strcspn(member, ".[");
    if (seg == 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        const struct mp_part *p = &parts[i];
        if (p->name_len < seg || strncasecmp(p->name, member, seg) != 0)
            continue;
        if (p->name_len == seg || p->name[seg] == '[' || p->name[seg] == '.')
            return (long)i;
    }
    return -1;
}

char *mp_fields_json(const struct mp_part *parts, size_t n, size_t *len)
{
    size_t cap = 3;
    for (size_t i = 0; i < n; i++) /* files are never fields */
        cap += 2 * (parts[i].name_len + (parts[i].filename ? 0 : parts[i].data_len)) + 6;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    size_t o = 0;
    buf[o++] = '{';
    for (size_t i = 0; i < n; i++) {
        const struct mp_part *pt = &parts[i];
        if (!field_kept(pt))
            continue;
        size_t j = 0;
        while (j < i && !(same_field(&parts[j], pt) && field_kept(&parts[j])))
            j++;
        if (j < i)
            continue; /* a repeated field keeps its first value */
        if (o > 1)
            buf[o++] = ',';
        o += put_json_string(buf + o, pt->name, pt->name_len);
        buf[o++] = ':';
        const char *num;
        size_t num_len;
        if (number_of(pt, &num, &num_len)) {
            memcpy(buf + o, num, num_len);
            o += num_len;
        } else {
            o += put_json_string(buf + o, pt->data, pt->data_len);
        }
    }
    buf[o++] = '}';
    buf[o] = '\0';
    *len = o;
    return buf;
}

int mp_content_type_of(const char *body, size_t len, char *out, size_t cap)
{
    if (cap)
        out[0] = '\0';
    if (!body || len < 5 || body[0] != '-' || body[1] != '-')
        return 0;
    const char *b = body + 2;
    const char *eol = memmem(b, len - 2, "\r\n", 2);
    if (!eol || !boundary_ok(b, (size_t)(eol - b)))
        return 0;
    int bl = (int)(eol - b);
    /* A boundary of token characters goes bare; one with others (a space, a colon) quoted. */
    int token = 1;
    for (int i = 0; i < bl; i++)
        token &= is_tchar((unsigned char)b[i]);
    int w = snprintf(out, cap, token ? "multipart/form-data; boundary=%.*s"
                                     : "multipart/form-data; boundary=\"%.*s\"",
                     bl, b);
    if (w < 0 || (size_t)w >= cap) {
        if (cap)
            out[0] = '\0';
        return 0;
    }
    return 1;
}
