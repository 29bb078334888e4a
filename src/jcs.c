#include "idemgate/jcs.h"
#include "idemgate/utf8.h"

#include <float.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Design: one pass parses the input into a flat pre-order array of 16-byte nodes, with decoded
 * strings and number tokens in one pool and container children in one index array; each object's
 * member list is merge-sorted (and checked for duplicates) when the object closes. The same pass
 * copies the input, minus the whitespace it skips between tokens, into the compacted buffer.
 * Those arrays become the document; one more pass writes the canonical text. Both passes use
 * explicit stacks, so hostile nesting cannot exhaust the C stack. Offsets are 32-bit to keep
 * nodes small, which limits inputs to under 4 GiB. */

enum node_type {
    N_NULL = JCS_NULL,
    N_FALSE = JCS_FALSE,
    N_TRUE = JCS_TRUE,
    N_NUM = JCS_NUMBER,
    N_STR = JCS_STRING,
    N_ARR = JCS_ARRAY,
    N_OBJ = JCS_OBJECT,
};

struct jcs_node {
    union {
        struct {
            uint32_t off; /* N_STR/N_NUM: offset in pool; N_ARR/N_OBJ: offset in kids */
            uint32_t len; /* N_STR: byte length; N_NUM: token length; N_ARR: elements;
                             N_OBJ: members */
        } span;
    } u;
    uint32_t src; /* byte offset of the value in the input, for error reports */
    uint8_t type;
};

/* What a parse leaves: nodes[0] is the top-level value; an object's member-name nodes in kids
 * are in canonical order, and each member's value node directly follows its name node. */
struct jcs_doc {
    struct jcs_node *nodes;
    char *pool; /* decoded strings, and number tokens each followed by a NUL */
    uint32_t *kids;
    char *compact; /* the input minus whitespace between tokens; NULL once taken */
    size_t compact_len;
    size_t in_len;     /* the input's length: a good first guess for the canonical form's */
    size_t max_frames; /* the deepest nesting, which sizes the writer's stack */
};

/* An open container during parsing: its node and where its children start on the child stack. */
struct frame {
    uint32_t node;
    uint32_t base;
};

/* An open container during writing: its node and the index of the child being written. */
struct wframe {
    uint32_t node;
    uint32_t i;
};

/* A member name being sorted. The prefix packs its first eight bytes, mapped by utf16_order()
 * and zero padded, big-endian, so that most comparisons are one integer compare instead of two
 * random memory reads; equal prefixes fall back to the full comparison. */
struct sort_item {
    uint64_t prefix;
    uint32_t node;
};

struct parser {
    const unsigned char *in;
    size_t len;
    size_t pos;
    int max_depth;
    struct jcs_error *err;

    struct jcs_node *nodes;
    size_t n_nodes, cap_nodes;
    /* Decoded strings never outgrow their escaped form, and a number token with its NUL takes no
     * more than the token and the byte after it (or the one spare byte, at the input's end), so
     * the pool is sized to the input once. */
    char *pool;
    size_t n_pool;
    /* The compacted input (sized to the input): compact[0..n_compact) holds in[0..span) minus
     * the whitespace skipped so far; in[span..pos) is still to be copied. */
    char *compact;
    size_t n_compact, span;
    /* Children of closed containers: element node indices for arrays, member-name node indices
     * for objects (a member's value node always directly follows its name node). */
    uint32_t *kids;
    size_t n_kids, cap_kids;
    /* Children of the containers still open, innermost last. */
    uint32_t *cs;
    size_t n_cs, cap_cs;
    struct frame *frames;
    size_t n_frames, cap_frames, max_frames;
    /* Merge-sort scratch, reused across objects. */
    struct sort_item *scratch;
    size_t cap_scratch;
};

/* Output buffer that records an allocation failure instead of returning it from every append,
 * so the writer can check once at the end. */
struct obuf {
    char *p;
    size_t len, cap;
    int failed;
};

static int fail(struct parser *p, int code, size_t offset, const char *what)
{
    p->err->code = code;
    p->err->offset = offset;
    p->err->what = what;
    return code;
}

/* Grows the array whose pointer is at arrp so that it holds at least need elements of size
 * elem, doubling to keep appends amortised O(1). The pointer is read and written with memcpy so
 * that one helper serves every element type without type-punning through void **. */
static int reserve(void *arrp, size_t *cap, size_t need, size_t elem)
{
    void *arr, *q;

    if (need <= *cap)
        return 0;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2 / elem)
            return -1;
        ncap *= 2;
    }
    memcpy(&arr, arrp, sizeof arr);
    if (!(q = realloc(arr, ncap * elem)))
        return -1;
    memcpy(arrp, &q, sizeof q);
    *cap = ncap;
    return 0;
}

/* The C locale, for strtod_l: a process that calls setlocale() must not change how numbers
 * parse. glibc hands out a static object for "C", so this never leaks. */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void c_locale_init(void)
{
    c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
}

static locale_t get_c_locale(void)
{
    pthread_once(&c_locale_once, c_locale_init);
    return c_locale;
}

/* ---- Numbers: ECMAScript Number.prototype.toString ---- */

/* Lays out the decimal digits s[0..k) of value 0.s × 10^n (sign aside) as ECMAScript does
 * (ECMA-262 Number::toString, radix 10). */
static int es_layout(char *buf, int neg, const char *s, int k, int n)
{
    char *o = buf;

    if (neg)
        *o++ = '-';
    if (k <= n && n <= 21) {
        memcpy(o, s, (size_t)k);
        o += k;
        memset(o, '0', (size_t)(n - k));
        o += n - k;
    } else if (0 < n && n <= 21) {
        memcpy(o, s, (size_t)n);
        o += n;
        *o++ = '.';
        memcpy(o, s + n, (size_t)(k - n));
        o += k - n;
    } else if (-6 < n && n <= 0) {
        *o++ = '0';
        *o++ = '.';
        memset(o, '0', (size_t)-n);
        o += -n;
        memcpy(o, s, (size_t)k);
        o += k;
    } else {
        int e = n - 1;
        *o++ = s[0];
        if (k > 1) {
            *o++ = '.';
            memcpy(o, s + 1, (size_t)(k - 1));
            o += k - 1;
        }
        *o++ = 'e';
        *o++ = e < 0 ? '-' : '+';
        if (e < 0)
            e = -e;
        char rev[8];
        int r = 0;
        do {
            rev[r++] = (char)('0' + e % 10);
            e /= 10;
        } while (e);
        while (r)
            *o++ = rev[--r];
    }
    *o = '\0';
    return (int)(o - buf);
}

/* Rounds a (> 0) correctly to p significant digits with printf and returns them in dig
 * (no trailing NUL), setting *exp10 so that a ≈ d.ddd × 10^exp10. Only the digits and the
 * exponent are read back, so whatever decimal point the current locale uses does not matter. */
static int sci_digits(double a, int p, char dig[24], int *exp10)
{
    char tmp[48];
    int k = 0, i = 0, e = 0, neg = 0;

    snprintf(tmp, sizeof tmp, "%.*e", p - 1, a);
    for (; tmp[i] && tmp[i] != 'e'; i++)
        if (tmp[i] >= '0' && tmp[i] <= '9' && k < 24)
            dig[k++] = tmp[i];
    if (tmp[i] == 'e')
        i++;
    if (tmp[i] == '-' || tmp[i] == '+')
        neg = tmp[i++] == '-';
    for (; tmp[i] >= '0' && tmp[i] <= '9'; i++)
        e = e * 10 + (tmp[i] - '0');
    *exp10 = neg ? -e : e;
    return k;
}

/* Whether d.ddd × 10^exp10 (digits dig[0..k)) reads back as exactly a. */
static int roundtrips(double a, const char *dig, int k, int exp10, locale_t loc)
{
    char tmp[48];
    int n = 0;

    tmp[n++] = dig[0];
    tmp[n++] = '.';
    memcpy(tmp + n, dig + 1, (size_t)(k - 1));
    n += k - 1;
    snprintf(tmp + n, sizeof tmp - (size_t)n, "e%d", exp10);
    return strtod_l(tmp, NULL, loc) == a;
}

/* Finds the shortest digit string that round-trips to a (> 0, finite): the smallest p in 1..17
 * for which the correctly rounded p-digit decimal reads back as a. Returns the digit count, or
 * -1 if the C locale is unavailable. (Checked against V8's Number.prototype.toString on all
 * powers of two and a few million other doubles: the closest p-digit decimal is never beaten by
 * a farther one at the asymmetric gap below a power of two.) */
static int shortest_digits(double a, char dig[24], int *exp10)
{
    locale_t loc = get_c_locale();
    int k;

    if (!loc)
        return -1;
    if (a >= DBL_MIN) {
        /* Near a normal double, decimals of at most 15 significant digits lie more than four
         * units in the last place apart, so at most one of them can read back as a: if the
         * 15-digit rounding does, it is the shortest once its trailing zeros go. That settles
         * most numbers in two library calls instead of up to fifteen. */
        k = sci_digits(a, 15, dig, exp10);
        while (k > 1 && dig[k - 1] == '0')
            k--;
        if (roundtrips(a, dig, k, *exp10, loc))
            return k;
        k = sci_digits(a, 16, dig, exp10);
        if (roundtrips(a, dig, k, *exp10, loc))
            return k;
        return sci_digits(a, 17, dig, exp10);
    }
    /* Subnormals have fewer significant bits, so short decimals are found by plain search. */
    for (int p = 1; p < 17; p++) {
        k = sci_digits(a, p, dig, exp10);
        if (roundtrips(a, dig, k, *exp10, loc))
            return k;
    }
    return sci_digits(a, 17, dig, exp10);
}

int jcs_format_double(double v, char buf[32])
{
    char dig[24];
    int k, exp10;

    if (!isfinite(v)) {
        buf[0] = '\0';
        return -1;
    }
    if (v == 0) {
        /* Both zeros print as "0" in ECMAScript. */
        buf[0] = '0';
        buf[1] = '\0';
        return 1;
    }
    int neg = signbit(v) != 0;
    double a = fabs(v);
    if (a < 9007199254740992.0 && a == (double)(uint64_t)a) {
        /* Below 2^53 an integer's own digits are the shortest that round-trip: any other
         * decimal with no more significant digits is at least 1 away, beyond half an ulp. */
        char rev[24];
        uint64_t u = (uint64_t)a;
        int r = 0;
        while (u) {
            rev[r++] = (char)('0' + u % 10);
            u /= 10;
        }
        for (k = 0; k < r; k++)
            dig[k] = rev[r - 1 - k];
        exp10 = r - 1;
        while (k > 1 && dig[k - 1] == '0')
            k--;
    } else {
        k = shortest_digits(a, dig, &exp10);
        if (k < 0) {
            buf[0] = '\0';
            return -1;
        }
    }
    return es_layout(buf, neg, dig, k, exp10 + 1);
}

/* ---- Parsing ---- */

static int is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Copies the input not yet copied, up to in[end], to the compacted buffer. */
static void flush_compact(struct parser *p, size_t end)
{
    if (end == p->span)
        return;
    memcpy(p->compact + p->n_compact, p->in + p->span, end - p->span);
    p->n_compact += end - p->span;
}

/* Skips whitespace between tokens (the only place the parser meets any outside strings), and
 * leaves it out of the compacted buffer. */
static void skip_ws(struct parser *p)
{
    size_t start = p->pos;

    while (p->pos < p->len && is_ws(p->in[p->pos]))
        p->pos++;
    if (p->pos > start) {
        flush_compact(p, start);
        p->span = p->pos;
    }
}

static int is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/* Bytes that would continue a number or literal token; after one of those tokens they mean a
 * malformed token (0x1F, 1.5.3, truex) rather than trailing data. */
static int is_token_byte(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' ||
           c == '+' || c == '-' || c == '_';
}

static int new_node(struct parser *p, uint8_t type, uint32_t *idx)
{
    if (reserve(&p->nodes, &p->cap_nodes, p->n_nodes + 1, sizeof *p->nodes))
        return fail(p, JCS_ENOMEM, p->pos, "out of memory");
    struct jcs_node *n = &p->nodes[p->n_nodes];
    memset(n, 0, sizeof *n);
    n->type = type;
    n->src = (uint32_t)p->pos;
    *idx = (uint32_t)p->n_nodes++;
    return 0;
}

static int push_child(struct parser *p, uint32_t idx)
{
    if (reserve(&p->cs, &p->cap_cs, p->n_cs + 1, sizeof *p->cs))
        return fail(p, JCS_ENOMEM, p->pos, "out of memory");
    p->cs[p->n_cs++] = idx;
    return 0;
}

static int hex4(const unsigned char *s)
{
    int v = 0;

    for (int i = 0; i < 4; i++) {
        unsigned char c = s[i];
        int d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static size_t utf8_put(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes the \u escape at in[i] (its backslash), joining a surrogate pair, and advances *pi
 * past it. */
static int parse_u_escape(struct parser *p, size_t *pi, uint32_t *cp)
{
    const unsigned char *in = p->in;
    size_t i = *pi;

    if (p->len - i < 6)
        return fail(p, JCS_ESYNTAX, i, "invalid \\u escape");
    int hi = hex4(in + i + 2);
    if (hi < 0)
        return fail(p, JCS_ESYNTAX, i, "invalid \\u escape");
    if (hi >= 0xDC00 && hi <= 0xDFFF)
        return fail(p, JCS_EUTF8, i, "lone low surrogate");
    if (hi < 0xD800 || hi > 0xDBFF) {
        *cp = (uint32_t)hi;
        *pi = i + 6;
        return 0;
    }
    if (p->len - i < 12 || in[i + 6] != '\\' || in[i + 7] != 'u')
        return fail(p, JCS_EUTF8, i, "lone high surrogate");
    int lo = hex4(in + i + 8);
    if (lo < 0)
        return fail(p, JCS_ESYNTAX, i + 6, "invalid \\u escape");
    if (lo < 0xDC00 || lo > 0xDFFF)
        return fail(p, JCS_EUTF8, i, "lone high surrogate");
    *cp = 0x10000 + (((uint32_t)hi - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
    *pi = i + 12;
    return 0;
}

/* Parses the string whose opening quote is at p->pos, decoding it into the pool, and leaves
 * p->pos after the closing quote. */
static int parse_string(struct parser *p, uint32_t *off, uint32_t *slen)
{
    const unsigned char *in = p->in;
    size_t n = p->len, i = p->pos + 1;
    char *o = p->pool + p->n_pool;
    char *start = o;

    for (;;) {
        if (i >= n)
            return fail(p, JCS_ESYNTAX, p->pos, "unterminated string");
        unsigned char c = in[i];
        if (c == '"')
            break;
        if (c >= 0x20 && c < 0x80 && c != '\\') {
            *o++ = (char)c;
            i++;
        } else if (c == '\\') {
            if (i + 1 >= n)
                return fail(p, JCS_ESYNTAX, p->pos, "unterminated string");
            char e;
            switch (in[i + 1]) {
            case '"':
                e = '"';
                break;
            case '\\':
                e = '\\';
                break;
            case '/':
                e = '/';
                break;
            case 'b':
                e = '\b';
                break;
            case 'f':
                e = '\f';
                break;
            case 'n':
                e = '\n';
                break;
            case 'r':
                e = '\r';
                break;
            case 't':
                e = '\t';
                break;
            case 'u': {
                uint32_t cp;
                int rc = parse_u_escape(p, &i, &cp);
                if (rc)
                    return rc;
                o += utf8_put(o, cp);
                continue;
            }
            default:
                return fail(p, JCS_ESYNTAX, i, "invalid escape");
            }
            *o++ = e;
            i += 2;
        } else if (c < 0x20) {
            return fail(p, JCS_ESYNTAX, i, "control character in string");
        } else {
            size_t k = utf8_seq(in + i, n - i);
            if (!k)
                return fail(p, JCS_EUTF8, i, "invalid UTF-8");
            memcpy(o, in + i, k);
            o += k;
            i += k;
        }
    }
    *off = (uint32_t)p->n_pool;
    *slen = (uint32_t)(o - start);
    p->n_pool += (size_t)(o - start);
    p->pos = i + 1;
    return 0;
}

/* ---- Numbers: exact decimal values ----
 *
 * RFC 8785 writes every number as the shortest decimal that reads back as its nearest double, so
 * 9007199254740993 and 9007199254740992 (one double) share a canonical form, while the gateway
 * sends the client's own digits and a provider may well read them as two values (issue 10, D13).
 * The rule here: let X be the exact decimal value of the number token (its digits and exponent,
 * no float arithmetic) and d the double nearest X. When X equals the value of shortest(d), the
 * RFC 8785 form of d is written, as before; otherwise X itself is written, exactly.
 *
 * Both branches come down to one operation. The RFC 8785 form of d is the ECMAScript layout
 * (es_layout: sign, then plain digits, 0.000ddd or d.ddde+N depending on the exponent) of the
 * digits of shortest(d); when X equals shortest(d) its normalised digits and exponent are those
 * same digits and exponent. So the writer applies the ECMAScript layout to X's normalised digits
 * (no leading or trailing zeros) and decimal exponent in every case: byte-identical to RFC 8785
 * whenever the client wrote a number's shortest digits, in any spelling (1, 1.0, 1e0, 10e-1,
 * 100000000000000000000000 and 1E23, -0 and 0), and the exact digits otherwise
 * (9007199254740993, 0.10000000000000001, 1e-400).
 *
 * Why this can never collide: the layout is a faithful decimal rendering of X (reading the text
 * back as a decimal gives X again), so two texts are equal only when the values are. In the terms
 * of the rule: if X differed from shortest(d) but its text equalled the RFC 8785 form of some
 * other number whose double is d2, then X = shortest(d2); shortest(d2) reads back as d2, so the
 * double nearest X is d2, that is d2 = d, and X = shortest(d), a contradiction. Two exact texts
 * are equal only for equal X, and two RFC 8785 texts only for one double, whose shortest value
 * is one X. */

/* The exact value of a valid number token: (-1)^neg × 0.D × 10^n, where D is the k digits of
 * the token's digit sequence C (integer digits, then fraction digits) from index first on, with
 * no leading or trailing zero. k == 0 means the value is zero (of either sign: both are 0). */
struct exact_num {
    const unsigned char *ip, *fp; /* integer and fraction digits in the token */
    size_t ni, nf;                /* their counts (nf is 0 without a fraction) */
    size_t first, k;
    int64_t n;
    int neg;
};

/* Exponents are read with saturation at this bound; a non-zero number whose exponent reaches it
 * is refused (a positive one would overflow a double anyway). With fewer than 2^32 digits the
 * normalised exponent then stays far inside int64_t. */
#define EXACT_EXP_CAP 1000000000000000LL

static unsigned char exact_digit(const struct exact_num *x, size_t j)
{
    return j < x->ni ? x->ip[j] : x->fp[j - x->ni];
}

/* Reads the number token t[0..len), which parse_number() has checked against the RFC 8259
 * grammar. Returns 0, or -1 when the value is non-zero and its exponent is out of range. */
static int exact_parse(const unsigned char *t, size_t len, struct exact_num *x)
{
    size_t i = 0;
    int64_t e = 0;
    int eneg = 0;

    memset(x, 0, sizeof *x);
    if (t[i] == '-') {
        x->neg = 1;
        i++;
    }
    x->ip = t + i;
    while (i < len && is_digit(t[i]))
        i++;
    x->ni = (size_t)(t + i - x->ip);
    x->fp = t + i;
    if (i < len && t[i] == '.') {
        x->fp = t + ++i;
        while (i < len && is_digit(t[i]))
            i++;
        x->nf = (size_t)(t + i - x->fp);
    }
    if (i < len && (t[i] == 'e' || t[i] == 'E')) {
        i++;
        if (t[i] == '+' || t[i] == '-')
            eneg = t[i++] == '-';
        for (; i < len; i++)
            if (e < EXACT_EXP_CAP)
                e = e * 10 + (t[i] - '0');
    }
    size_t m = x->ni + x->nf, a = 0, b = m;
    while (a < m && exact_digit(x, a) == '0')
        a++;
    if (a == m)
        return 0; /* zero: k stays 0, whatever the sign and exponent */
    while (exact_digit(x, b - 1) == '0')
        b--;
    x->first = a;
    x->k = b - a;
    /* 0.C × 10^(ni + e) is the value; dropping a leading zeros of C takes a from the exponent,
     * and dropping trailing zeros changes neither. */
    x->n = (int64_t)x->ni - (int64_t)a + (eneg ? -e : e);
    return e >= EXACT_EXP_CAP ? -1 : 0;
}

static void put(struct obuf *o, const void *s, size_t n);

/* Appends the digits D[from..from+count) of x. */
static void put_exact_digits(struct obuf *o, const struct exact_num *x, size_t from, size_t count)
{
    size_t j = x->first + from, end = j + count;

    if (j < x->ni) {
        size_t stop = end < x->ni ? end : x->ni;
        put(o, x->ip + j, stop - j);
        j = stop;
    }
    if (j < end)
        put(o, x->fp + (j - x->ni), end - j);
}

static void put_zeros(struct obuf *o, int64_t count)
{
    static const char zeros[] = "00000000000000000000000000000000";

    while (count > 0) {
        size_t c = count < 32 ? (size_t)count : 32;
        put(o, zeros, c);
        count -= (int64_t)c;
    }
}

/* Writes x in the ECMAScript layout (the same cases as es_layout(), for any number of digits and
 * any exponent): see the section comment above for why this is RFC 8785 whenever D are the
 * shortest digits of x's double, and exact otherwise. */
static void write_exact(struct obuf *o, const struct exact_num *x)
{
    int64_t k = (int64_t)x->k, n = x->n;

    if (!k) {
        put(o, "0", 1);
        return;
    }
    if (x->neg)
        put(o, "-", 1);
    if (k <= n && n <= 21) {
        put_exact_digits(o, x, 0, x->k);
        put_zeros(o, n - k);
    } else if (0 < n && n <= 21) {
        put_exact_digits(o, x, 0, (size_t)n);
        put(o, ".", 1);
        put_exact_digits(o, x, (size_t)n, (size_t)(k - n));
    } else if (-6 < n && n <= 0) {
        put(o, "0.", 2);
        put_zeros(o, -n);
        put_exact_digits(o, x, 0, x->k);
    } else {
        int64_t e = n - 1;
        char rev[24];
        int r = 0;
        put_exact_digits(o, x, 0, 1);
        if (k > 1) {
            put(o, ".", 1);
            put_exact_digits(o, x, 1, x->k - 1);
        }
        put(o, e < 0 ? "e-" : "e+", 2);
        if (e < 0)
            e = -e;
        do {
            rev[r++] = (char)('0' + e % 10);
            e /= 10;
        } while (e);
        while (r)
            put(o, &rev[--r], 1);
    }
}

/* Validates the RFC 8259 number at p->pos and checks that its nearest double is finite (numbers
 * beyond the double range are refused, as RFC 8785 requires). The token itself goes to the pool,
 * NUL-terminated for strtod_l, at *off (*tlen bytes): write_exact() renders it. */
static int parse_number(struct parser *p, uint32_t *off, uint32_t *tlen_out)
{
    const unsigned char *in = p->in;
    size_t n = p->len, start = p->pos, i = start;

    if (in[i] == '-')
        i++;
    if (i >= n || !is_digit(in[i]))
        return fail(p, JCS_ESYNTAX, i, "invalid number");
    if (in[i] == '0') {
        i++;
        if (i < n && is_digit(in[i]))
            return fail(p, JCS_ESYNTAX, i, "leading zero in number");
    } else {
        while (i < n && is_digit(in[i]))
            i++;
    }
    if (i < n && in[i] == '.') {
        i++;
        if (i >= n || !is_digit(in[i]))
            return fail(p, JCS_ESYNTAX, i, "invalid number");
        while (i < n && is_digit(in[i]))
            i++;
    }
    if (i < n && (in[i] == 'e' || in[i] == 'E')) {
        i++;
        if (i < n && (in[i] == '+' || in[i] == '-'))
            i++;
        if (i >= n || !is_digit(in[i]))
            return fail(p, JCS_ESYNTAX, i, "invalid number");
        while (i < n && is_digit(in[i]))
            i++;
    }
    if (i < n && is_token_byte(in[i]))
        return fail(p, JCS_ESYNTAX, i, "invalid number");

    size_t tlen = i - start;
    char *tok = p->pool + p->n_pool;
    memcpy(tok, in + start, tlen);
    tok[tlen] = '\0';
    struct exact_num x;
    int big = exact_parse((const unsigned char *)tok, tlen, &x);
    /* 0.D × 10^n is below 10^308 < DBL_MAX for n <= 308 and at least 10^309 (beyond the largest
     * value that rounds to a finite double) for n >= 310; only n == 309 needs the rounding, in
     * the C locale so that '.' is the decimal point whatever setlocale() the process did. */
    if (x.k && x.n > 309)
        return fail(p, JCS_ENUMBER, start, "number out of double range");
    if (big)
        return fail(p, JCS_ENUMBER, start, "number exponent out of range");
    if (x.k && x.n == 309 && !isfinite(strtod_l(tok, NULL, get_c_locale())))
        return fail(p, JCS_ENUMBER, start, "number out of double range");
    *off = (uint32_t)p->n_pool;
    *tlen_out = (uint32_t)tlen;
    p->n_pool += tlen + 1;
    p->pos = i;
    return 0;
}

static int parse_literal(struct parser *p, uint8_t *type)
{
    static const struct {
        const char *text;
        size_t len;
        uint8_t type;
    } lits[] = {{"true", 4, N_TRUE}, {"false", 5, N_FALSE}, {"null", 4, N_NULL}};

    for (size_t j = 0; j < sizeof lits / sizeof lits[0]; j++) {
        size_t end = p->pos + lits[j].len;
        if (p->in[p->pos] != (unsigned char)lits[j].text[0])
            continue;
        if (p->len - p->pos < lits[j].len || memcmp(p->in + p->pos, lits[j].text, lits[j].len) ||
            (end < p->len && is_token_byte(p->in[end])))
            return fail(p, JCS_ESYNTAX, p->pos, "invalid literal");
        *type = lits[j].type;
        p->pos = end;
        return 0;
    }
    return fail(p, JCS_ESYNTAX, p->pos, "unexpected character");
}

/* Maps a byte of well-formed UTF-8 so that comparing mapped bytes gives UTF-16 code unit order
 * (RFC 8785 §3.2.3). Byte order is code point order, and UTF-16 differs from that only by
 * putting U+E000..U+FFFF (lead bytes 0xEE, 0xEF) above U+10000 and up (lead bytes 0xF0..0xF4),
 * whose surrogates are 0xD800..0xDFFF. Those two bytes only ever occur as lead bytes, so moving
 * them above 0xF4 is all it takes. */
static unsigned utf16_order(unsigned char c)
{
    return c == 0xEE || c == 0xEF ? c + 7u : c;
}

/* Compares two names (decoded, well-formed UTF-8) as arrays of UTF-16 code units. The first
 * differing byte is at the same place in a code point in both names (they share the bytes before
 * it), so it decides. */
static int bytes_cmp(const unsigned char *sa, size_t la, const unsigned char *sb, size_t lb)
{
    size_t m = la < lb ? la : lb, i = 0;

    while (i < m && sa[i] == sb[i])
        i++;
    if (i == m)
        return la < lb ? -1 : la > lb;
    return utf16_order(sa[i]) < utf16_order(sb[i]) ? -1 : 1;
}

/* Compares two member names by their node indices. */
static int name_cmp(const struct parser *p, uint32_t a, uint32_t b)
{
    const struct jcs_node *na = &p->nodes[a], *nb = &p->nodes[b];

    return bytes_cmp((const unsigned char *)p->pool + na->u.span.off, na->u.span.len,
                     (const unsigned char *)p->pool + nb->u.span.off, nb->u.span.len);
}

static int item_less(const struct parser *p, const struct sort_item *x, const struct sort_item *y)
{
    if (x->prefix != y->prefix)
        return x->prefix < y->prefix;
    return name_cmp(p, x->node, y->node) < 0;
}

/* Sorts the member-name node indices v[0..n) with a stable bottom-up merge sort, so that equal
 * names stay in input order and the duplicate check can point at the later one. */
static int sort_names(struct parser *p, uint32_t *v, size_t n)
{
    if (reserve(&p->scratch, &p->cap_scratch, 2 * n, sizeof *p->scratch))
        return fail(p, JCS_ENOMEM, p->pos, "out of memory");
    struct sort_item *src = p->scratch, *dst = p->scratch + n;
    for (size_t i = 0; i < n; i++) {
        const struct jcs_node *nd = &p->nodes[v[i]];
        const unsigned char *s = (const unsigned char *)p->pool + nd->u.span.off;
        uint64_t prefix = 0;
        for (size_t j = 0; j < 8; j++)
            prefix = prefix << 8 | (j < nd->u.span.len ? utf16_order(s[j]) : 0);
        src[i].prefix = prefix;
        src[i].node = v[i];
    }
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n;
            size_t hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi)
                dst[o++] = item_less(p, &src[j], &src[i]) ? src[j++] : src[i++];
            while (i < mid)
                dst[o++] = src[i++];
            while (j < hi)
                dst[o++] = src[j++];
        }
        struct sort_item *t = src;
        src = dst;
        dst = t;
    }
    for (size_t i = 0; i < n; i++)
        v[i] = src[i].node;
    return 0;
}

/* Closes the innermost open container: moves its children to kids, and for an object sorts the
 * members and rejects duplicate names. */
static int close_container(struct parser *p)
{
    struct frame *f = &p->frames[p->n_frames - 1];
    struct jcs_node *nd = &p->nodes[f->node];
    size_t count = p->n_cs - f->base;

    if (reserve(&p->kids, &p->cap_kids, p->n_kids + count, sizeof *p->kids))
        return fail(p, JCS_ENOMEM, p->pos, "out of memory");
    /* An empty container can close before kids was ever allocated: NULL + 0 is undefined. */
    uint32_t *v = count ? p->kids + p->n_kids : NULL;
    if (count)
        memcpy(v, p->cs + f->base, count * sizeof *v);
    nd->u.span.off = (uint32_t)p->n_kids;
    nd->u.span.len = (uint32_t)count;
    if (nd->type == N_OBJ && count > 1) {
        int rc = sort_names(p, v, count);
        if (rc)
            return rc;
        size_t dup = SIZE_MAX;
        for (size_t i = 1; i < count; i++) {
            const struct jcs_node *a = &p->nodes[v[i - 1]], *b = &p->nodes[v[i]];
            if (a->u.span.len == b->u.span.len &&
                !memcmp(p->pool + a->u.span.off, p->pool + b->u.span.off, a->u.span.len) &&
                b->src < dup)
                dup = b->src;
        }
        if (dup != SIZE_MAX)
            return fail(p, JCS_EDUPKEY, dup, "duplicate member name");
    }
    p->n_kids += count;
    p->n_cs = f->base;
    p->n_frames--;
    return 0;
}

/* Parses `"name" :` at p->pos (after whitespace) and records the name as the next member. */
static int parse_name(struct parser *p)
{
    uint32_t idx, off, slen;
    int rc;

    skip_ws(p);
    if (p->pos >= p->len || p->in[p->pos] != '"')
        return fail(p, JCS_ESYNTAX, p->pos, "expected member name");
    if ((rc = new_node(p, N_STR, &idx)) || (rc = parse_string(p, &off, &slen)))
        return rc;
    p->nodes[idx].u.span.off = off;
    p->nodes[idx].u.span.len = slen;
    if ((rc = push_child(p, idx)))
        return rc;
    skip_ws(p);
    if (p->pos >= p->len || p->in[p->pos] != ':')
        return fail(p, JCS_ESYNTAX, p->pos, "expected ':'");
    p->pos++;
    return 0;
}

/* Parses the value at p->pos. A container is only opened (and its first member name read):
 * *opened tells the caller to parse its contents next. */
static int parse_value(struct parser *p, int *opened)
{
    uint32_t idx;
    int rc;

    *opened = 0;
    skip_ws(p);
    if (p->pos >= p->len)
        return fail(p, JCS_ESYNTAX, p->pos, "expected a value");
    unsigned char c = p->in[p->pos];
    if ((rc = new_node(p, N_NULL, &idx)))
        return rc;
    if (p->n_frames && p->nodes[p->frames[p->n_frames - 1].node].type == N_ARR &&
        (rc = push_child(p, idx)))
        return rc;
    struct jcs_node *nd = &p->nodes[idx];

    if (c == '[' || c == '{') {
        if (p->n_frames >= (size_t)(p->max_depth > 0 ? p->max_depth : 0))
            return fail(p, JCS_EDEPTH, p->pos, "nesting too deep");
        if (reserve(&p->frames, &p->cap_frames, p->n_frames + 1, sizeof *p->frames))
            return fail(p, JCS_ENOMEM, p->pos, "out of memory");
        nd->type = c == '[' ? N_ARR : N_OBJ;
        p->frames[p->n_frames].node = idx;
        p->frames[p->n_frames].base = (uint32_t)p->n_cs;
        p->n_frames++;
        if (p->n_frames > p->max_frames)
            p->max_frames = p->n_frames;
        p->pos++;
        skip_ws(p);
        if (p->pos < p->len && p->in[p->pos] == (c == '[' ? ']' : '}')) {
            if ((rc = close_container(p)))
                return rc;
            p->pos++;
            return 0;
        }
        *opened = 1;
        return c == '{' ? parse_name(p) : 0;
    }
    if (c == '"' || c == '-' || is_digit(c)) {
        uint32_t off, slen;
        if ((rc = c == '"' ? parse_string(p, &off, &slen) : parse_number(p, &off, &slen)))
            return rc;
        nd = &p->nodes[idx];
        nd->type = c == '"' ? N_STR : N_NUM;
        nd->u.span.off = off;
        nd->u.span.len = slen;
        return 0;
    }
    uint8_t type;
    if ((rc = parse_literal(p, &type)))
        return rc;
    nd->type = type;
    return 0;
}

/* Consumes what follows a complete value: separators and closing brackets. Returns 1 when
 * another value is expected, 0 when the document is complete, or an error. */
static int after_value(struct parser *p)
{
    int rc;

    for (;;) {
        skip_ws(p);
        if (!p->n_frames) {
            if (p->pos < p->len)
                return fail(p, JCS_ETRAILING, p->pos, "data after the top-level value");
            return 0;
        }
        int is_obj = p->nodes[p->frames[p->n_frames - 1].node].type == N_OBJ;
        if (p->pos >= p->len)
            return fail(p, JCS_ESYNTAX, p->pos, "unexpected end of input");
        unsigned char c = p->in[p->pos];
        if (c == ',') {
            p->pos++;
            if (is_obj && (rc = parse_name(p)))
                return rc;
            return 1;
        }
        if (c != (is_obj ? '}' : ']'))
            return fail(p, JCS_ESYNTAX, p->pos,
                        is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
        if ((rc = close_container(p)))
            return rc;
        p->pos++;
    }
}

static int parse_document(struct parser *p)
{
    for (;;) {
        int opened, rc = parse_value(p, &opened);
        if (rc)
            return rc;
        if (opened)
            continue;
        rc = after_value(p);
        if (rc <= 0)
            return rc;
    }
}

/* ---- Writing ---- */

static void put(struct obuf *o, const void *s, size_t n)
{
    if (o->failed)
        return;
    if (reserve(&o->p, &o->cap, o->len + n + 1, 1)) {
        o->failed = 1;
        return;
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
}

static void putc_(struct obuf *o, char c)
{
    put(o, &c, 1);
}

/* Writes a string as RFC 8785 §3.2.2.2 wants: only '"', '\\' and controls are escaped, with the
 * short forms where JSON has them and lowercase \u00xx otherwise. */
static void write_string(struct obuf *o, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t run = 0;

    putc_(o, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        put(o, s + run, i - run);
        run = i + 1;
        char esc[6] = {'\\', 0};
        size_t elen = 2;
        switch (c) {
        case '"':
            esc[1] = '"';
            break;
        case '\\':
            esc[1] = '\\';
            break;
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            elen = 6;
        }
        put(o, esc, elen);
    }
    put(o, s + run, n - run);
    putc_(o, '"');
}

static void write_scalar(const struct jcs_doc *d, const struct jcs_node *nd, struct obuf *o)
{
    struct exact_num x;

    switch (nd->type) {
    case N_NULL:
        put(o, "null", 4);
        break;
    case N_FALSE:
        put(o, "false", 5);
        break;
    case N_TRUE:
        put(o, "true", 4);
        break;
    case N_NUM:
        /* The parser admitted the token, so its exponent is in range. */
        (void)exact_parse((const unsigned char *)d->pool + nd->u.span.off, nd->u.span.len, &x);
        write_exact(o, &x);
        break;
    case N_STR:
        write_string(o, d->pool + nd->u.span.off, nd->u.span.len);
        break;
    case N_ARR:
        put(o, "[]", 2);
        break;
    default:
        put(o, "{}", 2);
        break;
    }
}

/* Returns the node of child i of container nd, first writing the member name and ':' when nd is
 * an object. */
static uint32_t enter_child(const struct jcs_doc *d, const struct jcs_node *nd, uint32_t i,
                            struct obuf *o)
{
    uint32_t k = d->kids[nd->u.span.off + i];

    if (nd->type == N_ARR)
        return k;
    const struct jcs_node *name = &d->nodes[k];
    write_string(o, d->pool + name->u.span.off, name->u.span.len);
    putc_(o, ':');
    return k + 1;
}

/* Writes node start and everything under it in canonical form. */
static int write_node(const struct jcs_doc *d, uint32_t start, struct obuf *o)
{
    struct wframe *st = NULL;
    size_t sp = 0;
    uint32_t cur = start;

    if (d->max_frames && !(st = malloc(d->max_frames * sizeof *st)))
        return -1;
    for (;;) {
        const struct jcs_node *nd = &d->nodes[cur];
        if ((nd->type == N_ARR || nd->type == N_OBJ) && nd->u.span.len) {
            putc_(o, nd->type == N_ARR ? '[' : '{');
            st[sp].node = cur;
            st[sp].i = 0;
            sp++;
            cur = enter_child(d, nd, 0, o);
            continue;
        }
        write_scalar(d, nd, o);
        /* Close every container whose last child this was, then move to the next sibling. */
        for (;;) {
            if (!sp) {
                free(st);
                return o->failed ? -1 : 0;
            }
            struct wframe *wf = &st[sp - 1];
            const struct jcs_node *parent = &d->nodes[wf->node];
            if (++wf->i < parent->u.span.len) {
                putc_(o, ',');
                cur = enter_child(d, parent, wf->i, o);
                break;
            }
            putc_(o, parent->type == N_ARR ? ']' : '}');
            sp--;
        }
    }
}

static void parser_free(struct parser *p)
{
    free(p->nodes);
    free(p->pool);
    free(p->compact);
    free(p->kids);
    free(p->cs);
    free(p->frames);
    free(p->scratch);
}

/* Moves what a successful parse built into a new document: the parser keeps only its scratch. */
static int doc_new(struct parser *p, struct jcs_doc **out)
{
    struct jcs_doc *d = malloc(sizeof *d);

    if (!d)
        return fail(p, JCS_ENOMEM, p->len, "out of memory");
    flush_compact(p, p->len);
    p->compact[p->n_compact] = '\0';
    d->nodes = p->nodes;
    d->pool = p->pool;
    d->kids = p->kids;
    d->compact = p->compact;
    d->compact_len = p->n_compact;
    d->in_len = p->len;
    d->max_frames = p->max_frames;
    p->nodes = NULL;
    p->pool = NULL;
    p->kids = NULL;
    p->compact = NULL;
    *out = d;
    return 0;
}

int jcs_parse(const char *in, size_t len, int max_depth, struct jcs_doc **out,
              struct jcs_error *err)
{
    struct jcs_error local;
    struct parser p;
    int rc;

    *out = NULL;
    if (!err)
        err = &local;
    memset(&p, 0, sizeof p);
    p.in = (const unsigned char *)in;
    p.len = len;
    p.max_depth = max_depth;
    p.err = err;
    *err = (struct jcs_error){.code = JCS_OK, .offset = 0, .what = "ok"};
    if (len >= UINT32_MAX)
        return fail(&p, JCS_ENOMEM, 0, "input too large");
    if (!get_c_locale())
        return fail(&p, JCS_ENOMEM, 0, "out of memory");
    p.pool = malloc(len + 1);
    p.compact = malloc(len + 1);
    if (!p.pool || !p.compact)
        rc = fail(&p, JCS_ENOMEM, 0, "out of memory");
    else if (!(rc = parse_document(&p)))
        rc = doc_new(&p, out);
    parser_free(&p);
    return rc;
}

void jcs_doc_free(struct jcs_doc *doc)
{
    if (!doc)
        return;
    free(doc->nodes);
    free(doc->pool);
    free(doc->kids);
    free(doc->compact);
    free(doc);
}

static int write_document(const struct jcs_doc *d, struct obuf *o)
{
    return write_node(d, 0, o);
}

/* 1 when the member name node k decodes to one of skip's names. */
static int skipped(const struct jcs_doc *d, uint32_t k, const char *const *skip)
{
    const struct jcs_node *name = &d->nodes[k];
    for (; skip && *skip; skip++)
        if (strlen(*skip) == name->u.span.len &&
            memcmp(*skip, d->pool + name->u.span.off, name->u.span.len) == 0)
            return 1;
    return 0;
}

int jcs_doc_canonical_except(const struct jcs_doc *doc, const char *const *skip, char **out,
                             size_t *out_len)
{
    const struct jcs_node *root = &doc->nodes[0];
    if (root->type != N_OBJ || !root->u.span.len || !skip || !*skip)
        return jcs_doc_canonical(doc, out, out_len);
    struct obuf o = {.cap = doc->in_len + 16};
    *out = NULL;
    *out_len = 0;
    o.p = malloc(o.cap);
    if (!o.p)
        return JCS_ENOMEM;
    putc_(&o, '{');
    int first = 1;
    for (uint32_t i = 0; i < root->u.span.len && !o.failed; i++) {
        uint32_t k = doc->kids[root->u.span.off + i];
        if (skipped(doc, k, skip))
            continue;
        if (!first)
            putc_(&o, ',');
        first = 0;
        const struct jcs_node *name = &doc->nodes[k];
        write_string(&o, doc->pool + name->u.span.off, name->u.span.len);
        putc_(&o, ':');
        if (write_node(doc, k + 1, &o))
            o.failed = 1;
    }
    putc_(&o, '}');
    if (o.failed) {
        free(o.p);
        return JCS_ENOMEM;
    }
    o.p[o.len] = '\0';
    *out = o.p;
    *out_len = o.len;
    return JCS_OK;
}

int jcs_doc_canonical(const struct jcs_doc *doc, char **out, size_t *out_len)
{
    /* Canonical text is usually no longer than the input; growth covers the rest. */
    struct obuf o = {.cap = doc->in_len + 16};

    *out = NULL;
    *out_len = 0;
    o.p = malloc(o.cap);
    if (!o.p || write_document(doc, &o)) {
        free(o.p);
        return JCS_ENOMEM;
    }
    o.p[o.len] = '\0';
    *out = o.p;
    *out_len = o.len;
    return JCS_OK;
}

char *jcs_doc_take_compact(struct jcs_doc *doc, size_t *len)
{
    char *c = doc->compact;

    *len = c ? doc->compact_len : 0;
    doc->compact = NULL;
    return c;
}

int jcs_canonicalize(const char *in, size_t len, int max_depth, char **out, size_t *out_len,
                     struct jcs_error *err)
{
    struct jcs_error local;
    struct jcs_doc *doc;

    *out = NULL;
    *out_len = 0;
    if (!err)
        err = &local;
    int rc = jcs_parse(in, len, max_depth, &doc, err);
    if (rc)
        return rc;
    rc = jcs_doc_canonical(doc, out, out_len);
    jcs_doc_free(doc);
    if (rc) {
        err->code = JCS_ENOMEM;
        err->offset = len;
        err->what = "out of memory";
    }
    return rc;
}

/* ---- Navigation ---- */

const struct jcs_node *jcs_doc_root(const struct jcs_doc *doc)
{
    return &doc->nodes[0];
}

enum jcs_type jcs_node_type(const struct jcs_node *n)
{
    return (enum jcs_type)n->type;
}

size_t jcs_node_count(const struct jcs_node *n)
{
    return n && (n->type == N_ARR || n->type == N_OBJ) ? n->u.span.len : 0;
}

const struct jcs_node *jcs_node_at(const struct jcs_doc *doc, const struct jcs_node *n, size_t i)
{
    if (!n || i >= jcs_node_count(n))
        return NULL;
    uint32_t k = doc->kids[n->u.span.off + i];
    /* An object's kids are its member names; each value follows its name. */
    return &doc->nodes[n->type == N_ARR ? k : k + 1];
}

const struct jcs_node *jcs_node_member(const struct jcs_doc *doc, const struct jcs_node *n,
                                       const char *name, size_t len)
{
    /* An empty object has no kids to point into (they may never have been allocated). */
    if (!n || n->type != N_OBJ || n->u.span.len == 0)
        return NULL;
    /* A binary search in canonical order. A name that is not well-formed UTF-8 may be misplaced
     * by bytes_cmp, but then it equals no member (decoded names are well-formed), so the answer
     * is still none. */
    const uint32_t *v = doc->kids + n->u.span.off;
    size_t lo = 0, hi = n->u.span.len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct jcs_node *k = &doc->nodes[v[mid]];
        int c = bytes_cmp((const unsigned char *)doc->pool + k->u.span.off, k->u.span.len,
                          (const unsigned char *)name, len);
        if (!c)
            return k + 1;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int jcs_node_number(const struct jcs_doc *doc, const struct jcs_node *n, double *v)
{
    if (!n || n->type != N_NUM)
        return -1;
    /* jcs_parse got the C locale before it admitted any number. */
    *v = strtod_l(doc->pool + n->u.span.off, NULL, get_c_locale());
    return 0;
}

const char *jcs_node_string(const struct jcs_doc *doc, const struct jcs_node *n, size_t *len)
{
    if (!n || n->type != N_STR) {
        *len = 0;
        return NULL;
    }
    *len = n->u.span.len;
    return doc->pool + n->u.span.off;
}

const char *jcs_strerror(int code)
{
    switch (code) {
    case JCS_OK:
        return "ok";
    case JCS_ENOMEM:
        return "out_of_memory";
    case JCS_ESYNTAX:
        return "syntax_error";
    case JCS_EDUPKEY:
        return "duplicate_key";
    case JCS_ENUMBER:
        return "invalid_number";
    case JCS_EDEPTH:
        return "too_deep";
    case JCS_EUTF8:
        return "invalid_utf8";
    case JCS_ETRAILING:
        return "trailing_data";
    default:
        return "unknown_error";
    }
}
