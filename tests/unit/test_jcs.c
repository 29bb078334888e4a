#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemgate/jcs.h"

#define DEPTH 64

/* Every case runs on an exact-size heap copy of its input with no NUL after it, so that ASan
 * catches any read past len. */
static char *heap_copy(const char *in, size_t len)
{
    char *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, in, len);
    return copy;
}

static int canon(const char *in, size_t len, int max_depth, char **out, size_t *out_len,
                 struct jcs_error *err)
{
    char *copy = heap_copy(in, len);
    int rc = jcs_canonicalize(copy, len, max_depth, out, out_len, err);
    free(copy);
    return rc;
}

/* Canonicalises a NUL-terminated document that must be valid and returns the malloc'd result. */
static char *canon_ok(const char *in)
{
    char *out = NULL;
    size_t out_len = 0;
    struct jcs_error err;
    int rc = canon(in, strlen(in), DEPTH, &out, &out_len, &err);
    if (rc)
        fail_msg("input %s: %s at %zu (%s)", in, jcs_strerror(rc), err.offset, err.what);
    assert_non_null(out);
    assert_int_equal(strlen(out), out_len);
    return out;
}

/* Parses a valid document from a heap copy that is scribbled over and freed before the document
 * is used: the document must not point into its input. */
static struct jcs_doc *parse_len(const char *in, size_t len)
{
    char *copy = heap_copy(in, len);
    struct jcs_doc *doc = (struct jcs_doc *)&doc;
    struct jcs_error err;
    int rc = jcs_parse(copy, len, DEPTH, &doc, &err);
    memset(copy, 'x', len);
    free(copy);
    if (rc)
        fail_msg("input %s: %s at %zu (%s)", in, jcs_strerror(rc), err.offset, err.what);
    assert_non_null(doc);
    return doc;
}

static struct jcs_doc *parse_ok(const char *in)
{
    return parse_len(in, strlen(in));
}

/* ---- Valid documents ---- */

struct ok_case {
    const char *in;
    size_t len; /* 0: strlen(in) */
    const char *out;
};

static const struct ok_case ok_cases[] = {
    /* RFC 8785 §3.2.3, the main example. Its 333333333.33333329 is not the shortest spelling
     * of its double (333333333.3333333 is): RFC 8785 would write the shorter, equal-as-a-double
     * digits, but a provider reading decimals sees two values, so the exact digits stay (issue
     * 10, D13). Every other number of the example comes out as RFC 8785 has it. */
    {"{\n"
     "  \"numbers\": [333333333.33333329, 1E30, 4.50,\n"
     "              2e-3, 0.000000000000000000000000001],\n"
     "  \"string\": \"\\u20ac$\\u000F\\u000aA'\\u0042\\u0022\\u005c\\\\\\\"\\/\",\n"
     "  \"literals\": [null, true, false]\n"
     "}",
     0,
     "{\"literals\":[null,true,false],\"numbers\":[333333333.33333329,1e+30,4.5,0.002,1e-27],"
     "\"string\":\"\xe2\x82\xac$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}"},
    /* RFC 8785 §3.2.3, the sorting example: members come out in UTF-16 code unit order. */
    {"{\n"
     "  \"\\u20ac\": \"Euro Sign\",\n"
     "  \"\\r\": \"Carriage Return\",\n"
     "  \"\\ufb33\": \"Hebrew Letter Dalet With Dagesh\",\n"
     "  \"1\": \"One\",\n"
     "  \"\\ud83d\\ude00\": \"Emoji: Grinning Face\",\n"
     "  \"\\u0080\": \"Control\",\n"
     "  \"\\u00f6\": \"Latin Small Letter O With Diaeresis\"\n"
     "}",
     0,
     "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\xc2\x80\":\"Control\","
     "\"\xc3\xb6\":\"Latin Small Letter O With Diaeresis\",\"\xe2\x82\xac\":\"Euro Sign\","
     "\"\xf0\x9f\x98\x80\":\"Emoji: Grinning Face\","
     "\"\xef\xac\xb3\":\"Hebrew Letter Dalet With Dagesh\"}"},
    /* Any value may be the top-level one, with RFC 8259 whitespace around it. */
    {"null", 0, "null"},
    {" \t\r\ntrue \t\r\n", 0, "true"},
    {"false", 0, "false"},
    {"\"\"", 0, "\"\""},
    {"[ ]", 0, "[]"},
    {"{ }", 0, "{}"},
    {"[[],{},[{}]]", 0, "[[],{},[{}]]"},
    {"[ 1 , [ 2 , { \"a\" : [ ] } ] ]", 0, "[1,[2,{\"a\":[]}]]"},
    /* Numbers take their ECMAScript form; the input spelling does not matter. A number whose
     * exact value is not the shortest decimal of its double keeps its exact digits, in the same
     * layout (see test_number_exact). */
    {"1.0", 0, "1"},
    {"-0.0", 0, "0"},
    {"-0", 0, "0"},
    {"1E2", 0, "100"},
    {"1e+2", 0, "100"},
    {"100e-2", 0, "1"},
    {"9007199254740993", 0, "9007199254740993"},
    {"1e-400", 0, "1e-400"},
    {"-1e-400", 0, "-1e-400"},
    {"123456789012345678901234567890", 0, "1.2345678901234567890123456789e+29"},
    {"0.1", 0, "0.1"},
    {"1e20", 0, "100000000000000000000"},
    {"1e21", 0, "1e+21"},
    {"0.000001", 0, "0.000001"},
    {"1e-7", 0, "1e-7"},
    {"-12.5e-1", 0, "-1.25"},
    {"[0,-1,2.50,-3E0]", 0, "[0,-1,2.5,-3]"},
    /* Strings: escapes decode, and only '"', '\\' and controls are escaped on output. */
    {"\"\\u00e9\"", 0, "\"\xc3\xa9\""},
    {"\"\\u00E9\"", 0, "\"\xc3\xa9\""},
    {"\"\\/\"", 0, "\"/\""},
    {"\"/\"", 0, "\"/\""},
    {"\"\\b\\f\\n\\r\\t\"", 0, "\"\\b\\f\\n\\r\\t\""},
    {"\"\\u0008\\u000C\\u000a\\u000D\\u0009\"", 0, "\"\\b\\f\\n\\r\\t\""},
    {"\"\\u0000\\u0001\\u001F\\u001b\"", 0, "\"\\u0000\\u0001\\u001f\\u001b\""},
    {"\"\\u007f\\u0080\"", 0, "\"\x7f\xc2\x80\""},
    {"\"\\\"\\\\\"", 0, "\"\\\"\\\\\""},
    {"\"\\ud83d\\ude00\"", 0, "\"\xf0\x9f\x98\x80\""},
    {"\"\\uDBFF\\uDFFF\"", 0, "\"\xf4\x8f\xbf\xbf\""},
    {"\"\\u2028\\u2029\"", 0, "\"\xe2\x80\xa8\xe2\x80\xa9\""},
    {"\"\\uFEFF\\uffff\"", 0, "\"\xef\xbb\xbf\xef\xbf\xbf\""},
    /* Raw UTF-8 of every length, including the extremes, passes through unchanged. */
    {"\"\xc2\x80\xdf\xbf\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80\xef\xbf\xbf\"", 0,
     "\"\xc2\x80\xdf\xbf\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80\xef\xbf\xbf\""},
    {"\"\xf0\x90\x80\x80\xf4\x8f\xbf\xbf\"", 0, "\"\xf0\x90\x80\x80\xf4\x8f\xbf\xbf\""},
    /* Sorting: U+10000 and up (surrogates in UTF-16) sort below U+E000..U+FFFF, unlike in
     * code point order; names longer than eight bytes and prefixes are ordered correctly. */
    {"{\"\\ue000\":1,\"\\ud800\\udc00\":2,\"\\ud7ff\":3}", 0,
     "{\"\xed\x9f\xbf\":3,\"\xf0\x90\x80\x80\":2,\"\xee\x80\x80\":1}"},
    {"{\"x\\uffff\":1,\"x\\udbff\\udfff\":2}", 0, "{\"x\xf4\x8f\xbf\xbf\":2,\"x\xef\xbf\xbf\":1}"},
    {"{\"abcdefghij2\":1,\"abcdefghij1\":2,\"abcdefgh\":3,\"abcdefghij\":4}", 0,
     "{\"abcdefgh\":3,\"abcdefghij\":4,\"abcdefghij1\":2,\"abcdefghij2\":1}"},
    {"{\"a\\u0000\":1,\"a\":2,\"\":3,\"\\u0000\":4}", 0,
     "{\"\":3,\"\\u0000\":4,\"a\":2,\"a\\u0000\":1}"},
    {"{\"b\":1,\"B\":2,\"a\":3,\"A\":4,\"_\":5}", 0, "{\"A\":4,\"B\":2,\"_\":5,\"a\":3,\"b\":1}"},
    {"{\"z\":{\"y\":1,\"x\":2},\"a\":[{\"d\":1,\"c\":2}]}", 0,
     "{\"a\":[{\"c\":2,\"d\":1}],\"z\":{\"x\":2,\"y\":1}}"},
    /* Only len bytes count: the input need not be NUL-terminated and may go on past len. */
    {"[1,2]garbage", 5, "[1,2]"},
    {"123", 2, "12"},
    {"\"a\\u0000b\"", 0, "\"a\\u0000b\""},
};

static void test_ok_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof ok_cases / sizeof ok_cases[0]; i++) {
        const struct ok_case *c = &ok_cases[i];
        size_t len = c->len ? c->len : strlen(c->in);
        char *out = NULL;
        size_t out_len = 0;
        struct jcs_error err;
        int rc = canon(c->in, len, DEPTH, &out, &out_len, &err);
        if (rc)
            fail_msg("case %zu: %s at %zu (%s)", i, jcs_strerror(rc), err.offset, err.what);
        if (out_len != strlen(c->out) || memcmp(out, c->out, out_len))
            fail_msg("case %zu: got %s, want %s", i, out, c->out);
        assert_int_equal(out[out_len], '\0');
        free(out);
    }
}

/* ---- Invalid documents ---- */

struct err_case {
    const char *in;
    size_t len; /* 0: strlen(in) */
    int code;
    size_t offset;
};

static const struct err_case err_cases[] = {
    /* Trailing bytes. */
    {"{} x", 0, JCS_ETRAILING, 3},
    {"1 2", 0, JCS_ETRAILING, 2},
    {"[] []", 0, JCS_ETRAILING, 3},
    {"\"a\"\"b\"", 0, JCS_ETRAILING, 3},
    {"{}\0", 3, JCS_ETRAILING, 2},
    /* Duplicate member names, also when they only become equal after unescaping; the offset
     * points at the later name. */
    {"{\"a\":1,\"a\":2}", 0, JCS_EDUPKEY, 7},
    {"{\"a\":1,\"\\u0061\":2}", 0, JCS_EDUPKEY, 7},
    {"{\"\\u00e9\":1,\"\xc3\xa9\":2}", 0, JCS_EDUPKEY, 12},
    {"{\"b\":1,\"a\":{\"c\":1,\"c\":2},\"a\":3}", 0, JCS_EDUPKEY, 18},
    {"{\"x\":1,\"a\":2,\"y\":3,\"a\":4,\"a\":5}", 0, JCS_EDUPKEY, 19},
    /* Numbers outside the double range. */
    {"1e999", 0, JCS_ENUMBER, 0},
    {"-1e999", 0, JCS_ENUMBER, 0},
    {"[1,-1e400]", 0, JCS_ENUMBER, 3},
    {"{\"a\":17976931348623159e292}", 0, JCS_ENUMBER, 5},
    {"1.7976931348623159e308", 0, JCS_ENUMBER, 0},
    {"9e308", 0, JCS_ENUMBER, 0},
    {"1e309", 0, JCS_ENUMBER, 0},
    {"0.00001e314", 0, JCS_ENUMBER, 0},
    {"1e99999999999999999999", 0, JCS_ENUMBER, 0},
    {"[0,-1e+99999999999999999999]", 0, JCS_ENUMBER, 3},
    /* A non-zero number with an exponent of 10^15 or more cannot be written exactly here (it
     * used to become 0): refused rather than collapsed. */
    {"1e-99999999999999999999", 0, JCS_ENUMBER, 0},
    {"[-0.5e-1000000000000000]", 0, JCS_ENUMBER, 1},
    /* Bad UTF-8 and lone surrogates. */
    {"\"\xff\"", 0, JCS_EUTF8, 1},
    {"\"\xc0\xaf\"", 0, JCS_EUTF8, 1},
    {"\"\xc1\xbf\"", 0, JCS_EUTF8, 1},
    {"\"\xe0\x80\xaf\"", 0, JCS_EUTF8, 1},
    {"\"\xf0\x80\x80\xaf\"", 0, JCS_EUTF8, 1},
    {"\"\xed\xa0\x80\"", 0, JCS_EUTF8, 1},
    {"\"\xed\xbf\xbf\"", 0, JCS_EUTF8, 1},
    {"\"\xf4\x90\x80\x80\"", 0, JCS_EUTF8, 1},
    {"\"\xf5\x80\x80\x80\"", 0, JCS_EUTF8, 1},
    {"\"a\x80\"", 0, JCS_EUTF8, 2},
    {"\"\xe2\x82\"", 0, JCS_EUTF8, 1},
    {"\"\xe2\x82", 0, JCS_EUTF8, 1},
    {"\"\\ud800\"", 0, JCS_EUTF8, 1},
    {"\"\\udc00\"", 0, JCS_EUTF8, 1},
    {"\"\\ude00\\ud83d\"", 0, JCS_EUTF8, 1},
    {"\"x\\ud800\\u0041\"", 0, JCS_EUTF8, 2},
    {"\"\\ud800\\ud800\"", 0, JCS_EUTF8, 1},
    {"{\"\\udbff\":1}", 0, JCS_EUTF8, 2},
    /* Everything else that RFC 8259 does not allow. */
    {"", 0, JCS_ESYNTAX, 0},
    {" \n\t\r ", 0, JCS_ESYNTAX, 5},
    {"\0", 1, JCS_ESYNTAX, 0},
    {"[\0]", 3, JCS_ESYNTAX, 1},
    {"[1,\0]", 5, JCS_ESYNTAX, 3},
    {"\"a\0b\"", 5, JCS_ESYNTAX, 2},
    {"\"a\x01\"", 0, JCS_ESYNTAX, 2},
    {"\"a\nb\"", 0, JCS_ESYNTAX, 2},
    {"\"a\x1f\"", 0, JCS_ESYNTAX, 2},
    {"01", 0, JCS_ESYNTAX, 1},
    {"-01", 0, JCS_ESYNTAX, 2},
    {"00", 0, JCS_ESYNTAX, 1},
    {".5", 0, JCS_ESYNTAX, 0},
    {"1.", 0, JCS_ESYNTAX, 2},
    {"1.e5", 0, JCS_ESYNTAX, 2},
    {"+1", 0, JCS_ESYNTAX, 0},
    {"-", 0, JCS_ESYNTAX, 1},
    {"- 1", 0, JCS_ESYNTAX, 1},
    {"1e", 0, JCS_ESYNTAX, 2},
    {"1e+", 0, JCS_ESYNTAX, 3},
    {"0x1F", 0, JCS_ESYNTAX, 1},
    {"1.5.3", 0, JCS_ESYNTAX, 3},
    {"NaN", 0, JCS_ESYNTAX, 0},
    {"Infinity", 0, JCS_ESYNTAX, 0},
    {"-Infinity", 0, JCS_ESYNTAX, 1},
    {"[1,]", 0, JCS_ESYNTAX, 3},
    {"[,1]", 0, JCS_ESYNTAX, 1},
    {"[1 2]", 0, JCS_ESYNTAX, 3},
    {"{\"a\":1,}", 0, JCS_ESYNTAX, 7},
    {"{,}", 0, JCS_ESYNTAX, 1},
    {"{\"a\" 1}", 0, JCS_ESYNTAX, 5},
    {"{\"a\":}", 0, JCS_ESYNTAX, 5},
    {"{a:1}", 0, JCS_ESYNTAX, 1},
    {"{'a':1}", 0, JCS_ESYNTAX, 1},
    {"{1:1}", 0, JCS_ESYNTAX, 1},
    {"{\"a\":1]", 0, JCS_ESYNTAX, 6},
    {"[1}", 0, JCS_ESYNTAX, 2},
    {"[", 0, JCS_ESYNTAX, 1},
    {"{\"a\":1", 0, JCS_ESYNTAX, 6},
    {"]", 0, JCS_ESYNTAX, 0},
    {"tru", 0, JCS_ESYNTAX, 0},
    {"truex", 0, JCS_ESYNTAX, 0},
    {"True", 0, JCS_ESYNTAX, 0},
    {"nul", 0, JCS_ESYNTAX, 0},
    {"\"abc", 0, JCS_ESYNTAX, 0},
    {"\"abc\\", 0, JCS_ESYNTAX, 0},
    {"\"\\x\"", 0, JCS_ESYNTAX, 1},
    {"\"\\'\"", 0, JCS_ESYNTAX, 1},
    {"\"\\u12\"", 0, JCS_ESYNTAX, 1},
    {"\"\\u12G4\"", 0, JCS_ESYNTAX, 1},
    {"\"\\ud800\\uzzzz\"", 0, JCS_ESYNTAX, 7},
    {"\xef\xbb\xbf{}", 0, JCS_ESYNTAX, 0},
    {"\f1", 0, JCS_ESYNTAX, 0},
    {"\xc2\xa0\x31", 0, JCS_ESYNTAX, 0},
    {"/* c */ 1", 0, JCS_ESYNTAX, 0},
};

static void test_err_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof err_cases / sizeof err_cases[0]; i++) {
        const struct err_case *c = &err_cases[i];
        size_t len = c->len ? c->len : strlen(c->in);
        char *out = (char *)&out; /* must be reset to NULL */
        size_t out_len = 7;
        struct jcs_error err = {0, 0, NULL};
        int rc = canon(c->in, len, DEPTH, &out, &out_len, &err);
        if (rc != c->code || err.offset != c->offset)
            fail_msg("case %zu: got %s at %zu (%s), want %s at %zu", i, jcs_strerror(rc),
                     err.offset, err.what ? err.what : "?", jcs_strerror(c->code), c->offset);
        assert_int_equal(err.code, c->code);
        assert_non_null(err.what);
        assert_true(strlen(err.what) > 0);
        assert_null(out);
        assert_int_equal(out_len, 0);
    }
}

/* The err argument is optional, and the return value alone tells the error. */
static void test_err_null(void **state)
{
    (void)state;
    char *out = NULL;
    size_t out_len;
    assert_int_equal(jcs_canonicalize("{\"a\":1,\"a\":1}", 13, DEPTH, &out, &out_len, NULL),
                     JCS_EDUPKEY);
    assert_null(out);
    assert_int_equal(jcs_canonicalize(NULL, 0, DEPTH, &out, &out_len, NULL), JCS_ESYNTAX);
    assert_null(out);
    assert_int_equal(jcs_canonicalize("[1]", 3, DEPTH, &out, &out_len, NULL), JCS_OK);
    assert_string_equal(out, "[1]");
    free(out);
}

/* ---- Numbers ---- */

struct num_case {
    uint64_t bits;
    const char *out;
};

/* RFC 8785 Appendix B and its test data, plus the edges of the ECMAScript layout rules. */
static const struct num_case num_cases[] = {
    {0x0000000000000000, "0"},
    {0x8000000000000000, "0"},
    {0x0000000000000001, "5e-324"},
    {0x8000000000000001, "-5e-324"},
    {0x7fefffffffffffff, "1.7976931348623157e+308"},
    {0xffefffffffffffff, "-1.7976931348623157e+308"},
    {0x4340000000000000, "9007199254740992"},
    {0xc340000000000000, "-9007199254740992"},
    {0x4430000000000000, "295147905179352830000"},
    {0x44b52d02c7e14af5, "9.999999999999997e+22"},
    {0x44b52d02c7e14af6, "1e+23"},
    {0x44b52d02c7e14af7, "1.0000000000000001e+23"},
    {0x444b1ae4d6e2ef4e, "999999999999999700000"},
    {0x444b1ae4d6e2ef4f, "999999999999999900000"},
    {0x444b1ae4d6e2ef50, "1e+21"},
    {0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
    {0x3eb0c6f7a0b5ed8d, "0.000001"},
    {0x41b3de4355555553, "333333333.3333332"},
    {0x41b3de4355555554, "333333333.33333325"},
    {0x41b3de4355555555, "333333333.3333333"},
    /* The brief had "333333333.33333337" (the %.17g digits) here; the 16 digits below are
     * shorter and read back as the same double, and RFC 8785 Appendix B lists them. */
    {0x41b3de4355555556, "333333333.3333334"},
    {0x41b3de4355555557, "333333333.33333343"},
    {0xbecbf647612f3696, "-0.0000033333333333333333"},
    {0x43143ff3c1cb0959, "1424953923781206.2"},
    {0x3ff0000000000000, "1"},
    {0xbff0000000000000, "-1"},
    {0x3fb999999999999a, "0.1"},
    {0x3fd5555555555555, "0.3333333333333333"},
    {0x3fd3333333333334, "0.30000000000000004"},
    {0x4059000000000000, "100"},
    {0x3e7ad7f29abcaf48, "1e-7"},
    {0x0010000000000000, "2.2250738585072014e-308"},
    {0x000fffffffffffff, "2.225073858507201e-308"},
    {0x433fffffffffffff, "9007199254740991"},
    {0x4340000000000001, "9007199254740994"},
    {0x3ff0000000000001, "1.0000000000000002"},
};

static double from_bits(uint64_t bits)
{
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* Writes another spelling of the canonical number text c (ECMAScript form) into buf: variant 0
 * pads the mantissa with zeros and writes E without '+'; variant 1 moves the decimal point one
 * place right and lowers the exponent by one. Both have the same exact value as c. */
static void respell(const char *c, int variant, char *buf, size_t size)
{
    char m[40];
    const char *e = strchr(c, 'e');
    size_t ml = e ? (size_t)(e - c) : strlen(c);
    long x = e ? strtol(e + 1, NULL, 10) : 0;

    memcpy(m, c, ml);
    m[ml] = '\0';
    if (variant == 0) {
        snprintf(buf, size, "%s%s%s%ld", m, strchr(m, '.') ? "000" : ".000", e ? "E" : "", x);
        if (!e)
            buf[strlen(buf) - 1] = '\0'; /* drop the "0" of the absent exponent */
        return;
    }
    /* Digits before and after the point, the sign aside. */
    int neg = m[0] == '-';
    char ip[40], fp[40];
    const char *dot = strchr(m, '.');
    size_t il = dot ? (size_t)(dot - m) - (size_t)neg : ml - (size_t)neg;
    memcpy(ip, m + neg, il);
    ip[il] = '\0';
    snprintf(fp, sizeof fp, "%s", dot ? dot + 1 : "");
    /* Move the first fraction digit (or a 0) to the integer part. */
    size_t fl = strlen(fp);
    ip[il++] = fl ? fp[0] : '0';
    ip[il] = '\0';
    memmove(fp, fp + (fl ? 1 : 0), fl ? fl : 1);
    const char *ipp = ip;
    while (ipp[0] == '0' && ipp[1])
        ipp++;
    snprintf(buf, size, "%s%s%s%se%ld", neg ? "-" : "", ipp, fp[0] ? "." : "", fp, x - 1);
}

static void test_number_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof num_cases / sizeof num_cases[0]; i++) {
        const struct num_case *c = &num_cases[i];
        double v = from_bits(c->bits);
        char buf[32];

        /* Formatting the double directly. */
        int n = jcs_format_double(v, buf);
        if (n != (int)strlen(c->out) || strcmp(buf, c->out))
            fail_msg("case %zu (0x%016llx): got %s, want %s", i, (unsigned long long)c->bits, buf,
                     c->out);

        /* The canonical form itself, and other spellings of its exact value, inside an array:
         * a body written with the shortest digits canonicalises as RFC 8785 has it (stored
         * fingerprints of such bodies do not change). */
        char doc[160], want[48];
        snprintf(want, sizeof want, "[%s]", c->out);
        for (int variant = -1; variant < 2; variant++) {
            char spelled[128];
            if (variant < 0)
                snprintf(spelled, sizeof spelled, "%s", c->out);
            else
                respell(c->out, variant, spelled, sizeof spelled);
            snprintf(doc, sizeof doc, "[ %s ]", spelled);
            char *out = canon_ok(doc);
            if (strcmp(out, want))
                fail_msg("case %zu: %s gave %s, want %s", i, doc, out, want);
            free(out);
        }

        /* The 17-digit spelling keeps the double (and is exact when it is not the shortest
         * one), and canonical text canonicalises to itself. */
        snprintf(doc, sizeof doc, "%.17g", v);
        char *out = canon_ok(doc);
        if (strtod(out, NULL) != v || signbit(strtod(out, NULL)) != signbit(v + 0.0))
            fail_msg("case %zu: %s gave %s, another double", i, doc, out);
        char *again = canon_ok(out);
        assert_string_equal(again, out);
        free(again);
        free(out);
    }
}

static void test_format_nonfinite(void **state)
{
    (void)state;
    char buf[32] = "x";
    assert_int_equal(jcs_format_double(INFINITY, buf), -1);
    assert_string_equal(buf, "");
    assert_int_equal(jcs_format_double(-INFINITY, buf), -1);
    assert_int_equal(jcs_format_double(NAN, buf), -1);
}

/* Number parsing and printing must not follow a locale whose decimal point is not '.'. */
static void test_number_locale(void **state)
{
    (void)state;
    const char *names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "ru_RU.UTF-8"};
    const char *found = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !found; i++)
        if (setlocale(LC_NUMERIC, names[i]))
            found = names[i];
    /* Only a locale whose decimal point differs from '.' proves anything. */
    if (found && !strcmp(localeconv()->decimal_point, ".")) {
        setlocale(LC_NUMERIC, "C");
        found = NULL;
    }
    if (!found)
        skip();
    /* The last number is rounded (strtod) to check the double range; the formatter is called
     * directly too. */
    char *out = canon_ok("[1.5,0.1,1e-7,333333333.33333329,1.7976931348623157e308]");
    struct jcs_doc *doc = parse_ok("[2.5]");
    double v = 0;
    assert_int_equal(jcs_node_number(doc, jcs_node_at(doc, jcs_doc_root(doc), 0), &v), 0);
    jcs_doc_free(doc);
    char buf[32];
    int n1 = jcs_format_double(333333333.33333329, buf);
    char buf2[32];
    int n2 = jcs_format_double(0.5, buf2);
    setlocale(LC_NUMERIC, "C");
    assert_string_equal(out, "[1.5,0.1,1e-7,333333333.33333329,1.7976931348623157e+308]");
    assert_int_equal(n1, 17);
    assert_string_equal(buf, "333333333.3333333");
    assert_int_equal(n2, 3);
    assert_string_equal(buf2, "0.5");
    assert_true(v == 2.5);
    free(out);
}

/* ---- Exact numbers (issue 10, D13) ---- */

/* A number whose exact value is not the shortest decimal of its nearest double is written with
 * its own normalised digits in the ECMAScript layout: plain up to 21 integer digits, 0.000ddd
 * down to 10^-7, d.ddde±N otherwise. */
static const struct ok_case exact_cases[] = {
    /* The case, top level and inside a body. */
    {"9007199254740993", 0, "9007199254740993"},
    {"-9007199254740993", 0, "-9007199254740993"},
    {"{\"seed\":9007199254740993}", 0, "{\"seed\":9007199254740993}"},
    {"{\"seed\":9007199254740992}", 0, "{\"seed\":9007199254740992}"},
    {"18446744073709551617", 0, "18446744073709551617"},
    {"12345678901234567890", 0, "12345678901234567890"},
    /* Integers up to 21 digits are plain, longer ones (n = 22) exponent form. */
    {"123456789012345678901", 0, "123456789012345678901"},
    {"1234567890123456789012", 0, "1.234567890123456789012e+21"},
    {"99999999999999999999999", 0, "9.9999999999999999999999e+22"},
    /* The exact value of the double nearest 1e23, and the largest finite double's. */
    {"99999999999999991611392", 0, "9.9999999999999991611392e+22"},
    {"1.7976931348623158e308", 0, "1.7976931348623158e+308"},
    {"1e308", 0, "1e+308"},
    /* Fractions: plain from 10^-6 (n = -5) on, exponent form below. */
    {"0.10000000000000001", 0, "0.10000000000000001"},
    {"0.1000000000000000055511151231257827021181583404541015625", 0,
     "0.1000000000000000055511151231257827021181583404541015625"},
    {"12.3456789012345678901234567890e5", 0, "1234567.8901234567890123456789"},
    {"0.0000012345678901234567890", 0, "0.000001234567890123456789"},
    {"0.00000012345678901234567890", 0, "1.234567890123456789e-7"},
    {"-0.000000123456789012345678", 0, "-1.23456789012345678e-7"},
    {"333333333.33333329", 0, "333333333.33333329"},
    {"4.9406564584124654e-324", 0, "4.9406564584124654e-324"},
    /* Beneath the doubles: the value stays, instead of becoming 0. */
    {"1e-400", 0, "1e-400"},
    {"2.5e-324", 0, "2.5e-324"},
    {"-12.5e-99999", 0, "-1.25e-99998"},
    {"1e-999999999999999", 0, "1e-999999999999999"},
    /* Zeros of any sign and exponent are 0, even exponents far out of range. */
    {"0e-99999999999999999999999", 0, "0"},
    {"-0.000E+99999999999999999999", 0, "0"},
    /* Long digit strings split around the point keep every digit. */
    {"[1000000000000000000000000000000000000000.0000000000000000000000000000000000000001]", 0,
     "[1.0000000000000000000000000000000000000000000000000000000000000000000000000000001e+39]"},
};

/* Spellings of one exact value, all giving the group's text. */
struct num_group {
    const char *out;
    const char *in[9];
};

static const struct num_group num_groups[] = {
    {"1", {"1", "1.0", "1e0", "10e-1", "0.1e1", "1.000E+0", "100e-2", "0.00001e5", NULL}},
    {"0",
     {"0", "-0", "0.0", "-0.0e5", "0e-400", "0.000E+400", "-0E0", "0e99999999999999999999", NULL}},
    {"0.1", {"0.1", "1e-1", "0.10", "10e-2", "0.0001e3", "1E-1", NULL}},
    {"1e+23",
     {"1E23", "100000000000000000000000", "1e+23", "0.1e24", "100000000000000000000000.0",
      "10000000000000000000000000e-2", NULL}},
    {"9007199254740993",
     {"9007199254740993", "9007199254740993.0", "9.007199254740993e15", "90071992547409930e-1",
      "0.9007199254740993E+16", NULL}},
    {"-1.5", {"-1.5", "-15e-1", "-1.50", "-0.0015e3", "-150E-2", NULL}},
    {"1e-400", {"1e-400", "0.1e-399", "10E-401", "0.0000000001e-390", NULL}},
    {"1.2345678901234567890123456789e+29",
     {"123456789012345678901234567890", "1.2345678901234567890123456789e29",
      "0.12345678901234567890123456789e30", "123456789012345678901234567890.000", NULL}},
    {"0.000001", {"1e-6", "0.000001", "10e-7", "0.0000010", NULL}},
    {"1e-7", {"1e-7", "0.0000001", "0.00000010", "1E-7", NULL}},
    {"1e+21", {"1e21", "1000000000000000000000", "1.0e+21", NULL}},
    {"100000000000000000000", {"1e20", "100000000000000000000", "100000000000000000000.0", NULL}},
    {"12.5", {"12.5", "125e-1", "1.25e1", "12.50", NULL}},
};

/* Pairs that a provider reading decimals sees as two values, though most of them round to one
 * double (RFC 8785 alone would give them one canonical form). */
static const char *const num_differ[][2] = {
    {"9007199254740993", "9007199254740992"},
    {"-9007199254740993", "-9007199254740992"},
    {"{\"seed\":9007199254740993}", "{\"seed\":9007199254740992}"},
    {"[9007199254740995]", "[9007199254740996]"},
    {"18446744073709551617", "18446744073709551616"},
    {"123456789012345678901234567890", "123456789012345678901234567891"},
    {"0.1", "0.10000000000000001"},
    {"0.1", "0.1000000000000000055511151231257827021181583404541015625"},
    {"333333333.33333329", "333333333.3333333"},
    {"1e23", "99999999999999991611392"},
    {"1.7976931348623157e308", "1.7976931348623158e308"},
    {"5e-324", "4.9406564584124654e-324"},
    {"1e-400", "0"},
    {"1e-400", "2e-400"},
    {"-1e-400", "1e-400"},
    {"2.5e-324", "0"},
    {"1.0000000000000000000001", "1"},
};

static void test_number_exact(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof exact_cases / sizeof exact_cases[0]; i++) {
        char *out = canon_ok(exact_cases[i].in);
        if (strcmp(out, exact_cases[i].out))
            fail_msg("exact case %zu: got %s, want %s", i, out, exact_cases[i].out);
        /* Canonical text canonicalises to itself. */
        char *again = canon_ok(out);
        assert_string_equal(again, out);
        free(again);
        free(out);
    }
    for (size_t g = 0; g < sizeof num_groups / sizeof num_groups[0]; g++) {
        for (size_t i = 0; num_groups[g].in[i]; i++) {
            char *out = canon_ok(num_groups[g].in[i]);
            if (strcmp(out, num_groups[g].out))
                fail_msg("number group %zu input %s: got %s, want %s", g, num_groups[g].in[i], out,
                         num_groups[g].out);
            free(out);
        }
    }
    for (size_t i = 0; i < sizeof num_differ / sizeof num_differ[0]; i++) {
        char *a = canon_ok(num_differ[i][0]);
        char *b = canon_ok(num_differ[i][1]);
        if (!strcmp(a, b))
            fail_msg("number pair %zu: both gave %s", i, a);
        free(a);
        free(b);
    }
}

/* Over many doubles (a fixed pseudo-random sequence of bit patterns and integers): the RFC 8785
 * form canonicalises to itself, so bodies written with shortest digits keep their fingerprints;
 * the 17-digit form reads back as the same double and is RFC 8785 exactly when its digits,
 * trailing zeros aside, are the shortest ones. */
static void test_number_random(void **state)
{
    (void)state;
    uint64_t r = 0x9e3779b97f4a7c15u;
    for (int i = 0; i < 20000; i++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        double v = i % 4 == 3 ? (double)(int64_t)(r >> (i % 64)) : from_bits(r);
        if (!isfinite(v))
            continue;
        char shortest[32], doc[40];
        int n = jcs_format_double(v, shortest);
        assert_true(n > 0);
        char *out = canon_ok(shortest);
        if (strcmp(out, shortest))
            fail_msg("%s gave %s", shortest, out);
        free(out);

        snprintf(doc, sizeof doc, "%.17e", v);
        out = canon_ok(doc);
        assert_true(strtod(out, NULL) == v);
        /* Same digits as the shortest form, trailing zeros aside, gives the same text. */
        char d17[24], ds[24];
        size_t a = 0, b = 0;
        for (const char *q = doc; *q && *q != 'e'; q++)
            if (*q >= '0' && *q <= '9')
                d17[a++] = *q;
        for (const char *q = shortest; *q && *q != 'e'; q++)
            if (*q >= '0' && *q <= '9')
                ds[b++] = *q;
        while (a > 1 && d17[a - 1] == '0')
            a--;
        size_t lead = 0;
        while (lead + 1 < b && ds[lead] == '0')
            lead++;
        while (b > lead + 1 && ds[b - 1] == '0')
            b--;
        int same = v != 0 && a == b - lead && !memcmp(d17, ds + lead, a);
        if (same != !strcmp(out, shortest) && v != 0)
            fail_msg("%s gave %s (shortest %s)", doc, out, shortest);
        free(out);
    }
}

/* ---- Equivalence and sensitivity ---- */

/* Each group lists spellings of one document (shuffled members, varied whitespace, escapes,
 * number forms); all must give the group's canonical text byte for byte. */
struct equiv_group {
    const char *out;
    const char *in[6];
};

static const struct equiv_group equiv_groups[] = {
    {"{\"a\":\"\xc3\xa9\",\"b\":[1,2,{\"x\":true,\"y\":null}],\"c\":{}}",
     {"{\"a\":\"\xc3\xa9\",\"b\":[1,2,{\"x\":true,\"y\":null}],\"c\":{}}",
      "{\"c\":{},\"b\":[1,2,{\"y\":null,\"x\":true}],\"a\":\"\\u00e9\"}",
      " { \"b\" : [ 1.0 , 2e0 , { \"x\" : true , \"y\" : null } ] , \"a\" : \"\\u00E9\" ,"
      " \"c\" : { } } ",
      "\r\n\t{\"\\u0062\":[10e-1,0.2E1,{\"\\u0079\":null,\"x\":true}],\n\"c\"\t:{\r},"
      "\"a\":\"\xc3\xa9\"}\n",
      NULL}},
    {"{\"id\":\"req-1\",\"items\":[{\"qty\":3,\"sku\":\"A/1\"}],\"total\":12.5}",
     {"{\"total\":12.50,\"items\":[{\"sku\":\"A\\/1\",\"qty\":3}],\"id\":\"req-1\"}",
      "{\"items\":[{\"qty\":3e0,\"sku\":\"A/1\"}],\"id\":\"req\\u002d1\",\"total\":1.25e1}",
      "{ \"id\" : \"req-1\" , \"total\" : 125E-1 , \"items\" : [ { \"qty\" : 0.3e1 , "
      "\"sku\" : \"\\u0041/1\" } ] }",
      NULL}},
};

static void test_equivalence(void **state)
{
    (void)state;
    for (size_t g = 0; g < sizeof equiv_groups / sizeof equiv_groups[0]; g++) {
        for (size_t i = 0; equiv_groups[g].in[i]; i++) {
            char *out = canon_ok(equiv_groups[g].in[i]);
            if (strcmp(out, equiv_groups[g].out))
                fail_msg("group %zu input %zu: got %s, want %s", g, i, out, equiv_groups[g].out);
            free(out);
        }
    }
}

/* Pairs of documents that differ in meaning must give different canonical text. */
static const char *const differ_pairs[][2] = {
    {"1", "2"},
    {"\"a\"", "\"b\""},
    {"\"a\"", "\"A\""},
    {"{\"a\":1}", "{\"a\":2}"},
    {"{\"a\":1}", "{\"b\":1}"},
    {"[1,2]", "[2,1]"},
    {"null", "false"},
    {"0", "false"},
    {"\"1\"", "1"},
    {"[]", "{}"},
    {"{\"a\":[]}", "{\"a\":{}}"},
    {"0.1", "0.10000000000000002"},
    {"9007199254740992", "9007199254740994"},
    {"{\"a\":{\"b\":1}}", "{\"a\":{\"b\":1,\"c\":1}}"},
    {"\"a\\u0000\"", "\"a\""},
};

static void test_value_change(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof differ_pairs / sizeof differ_pairs[0]; i++) {
        char *a = canon_ok(differ_pairs[i][0]);
        char *b = canon_ok(differ_pairs[i][1]);
        if (!strcmp(a, b))
            fail_msg("pair %zu: both gave %s", i, a);
        free(a);
        free(b);
    }
}

/* ---- Depth ---- */

/* Builds `depth` nested containers: arrays, or objects of the form {"k":...}, around a 0. */
static char *nested(int depth, int objects, size_t *len)
{
    size_t cap = (size_t)depth * 6 + 2, n = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    for (int i = 0; i < depth; i++) {
        if (objects) {
            memcpy(s + n, "{\"k\":", 5);
            n += 5;
        } else {
            s[n++] = '[';
        }
    }
    s[n++] = '0';
    for (int i = 0; i < depth; i++)
        s[n++] = objects ? '}' : ']';
    s[n] = '\0';
    *len = n;
    return s;
}

static void test_depth(void **state)
{
    (void)state;
    for (int objects = 0; objects <= 1; objects++) {
        size_t len;
        char *out = NULL;
        size_t out_len;
        struct jcs_error err;

        /* Exactly max_depth levels pass and come back unchanged (the input is canonical). */
        char *s = nested(DEPTH, objects, &len);
        assert_int_equal(canon(s, len, DEPTH, &out, &out_len, &err), JCS_OK);
        assert_int_equal(out_len, len);
        assert_memory_equal(out, s, len);
        free(out);
        free(s);

        /* One more level fails at the opening bracket of level max_depth + 1. */
        s = nested(DEPTH + 1, objects, &len);
        assert_int_equal(canon(s, len, DEPTH, &out, &out_len, &err), JCS_EDEPTH);
        assert_int_equal(err.offset, (size_t)DEPTH * (objects ? 5 : 1));
        assert_null(out);
        free(s);
    }
}

/* Hostile nesting fails cleanly, and even a huge allowed depth does not recurse on the C
 * stack: parsing and writing use explicit stacks. */
static void test_depth_hostile(void **state)
{
    (void)state;
    const size_t n = 100000;
    char *s = malloc(2 * n);
    assert_non_null(s);
    memset(s, '[', n);
    memset(s + n, ']', n);
    char *out = NULL;
    size_t out_len;
    struct jcs_error err;

    assert_int_equal(canon(s, n, DEPTH, &out, &out_len, &err), JCS_EDEPTH);
    assert_int_equal(err.offset, DEPTH);
    assert_null(out);
    assert_int_equal(canon(s, 2 * n, DEPTH, &out, &out_len, &err), JCS_EDEPTH);
    assert_null(out);

    assert_int_equal(canon(s, 2 * n, (int)n, &out, &out_len, &err), JCS_OK);
    assert_int_equal(out_len, 2 * n);
    assert_memory_equal(out, s, 2 * n);
    free(out);
    assert_int_equal(canon(s, 2 * n, (int)n - 1, &out, &out_len, &err), JCS_EDEPTH);
    assert_int_equal(err.offset, n - 1);
    free(s);

    /* A depth limit of zero still allows scalars. */
    assert_int_equal(canon("7", 1, 0, &out, &out_len, &err), JCS_OK);
    free(out);
    assert_int_equal(canon("[]", 2, 0, &out, &out_len, &err), JCS_EDEPTH);
    assert_int_equal(canon("{}", 2, -1, &out, &out_len, &err), JCS_EDEPTH);
}

/* ---- Size ---- */

/* A large object with members in scrambled order comes out sorted, and a large array keeps its
 * order; both stay fast (no quadratic step). */
static void test_large(void **state)
{
    (void)state;
    const unsigned n = 50000;
    size_t cap = (size_t)n * 24 + 16;
    char *in = malloc(cap), *want = malloc(cap);
    assert_non_null(in);
    assert_non_null(want);

    /* Member i is visited in the order i * 7919 mod n (7919 is prime, so this is a
     * permutation); names are zero-padded so that byte order is numeric order. */
    size_t a = 0, b = 0;
    in[a++] = '{';
    want[b++] = '{';
    for (unsigned i = 0; i < n; i++) {
        unsigned k = (unsigned)(((unsigned long long)i * 7919) % n);
        a += (size_t)sprintf(in + a, "%s \"key%06u\" : %u", i ? "," : "", k, k);
        b += (size_t)sprintf(want + b, "%s\"key%06u\":%u", i ? "," : "", i, i);
    }
    in[a++] = '}';
    want[b++] = '}';
    char *out = NULL;
    size_t out_len;
    struct jcs_error err;
    assert_int_equal(canon(in, a, DEPTH, &out, &out_len, &err), JCS_OK);
    assert_int_equal(out_len, b);
    assert_memory_equal(out, want, b);
    free(out);

    a = 0;
    in[a++] = '[';
    for (unsigned i = 0; i < n; i++)
        a += (size_t)sprintf(in + a, "%s%u.50", i ? ", " : "", n - i);
    in[a++] = ']';
    assert_int_equal(canon(in, a, DEPTH, &out, &out_len, &err), JCS_OK);
    assert_memory_equal(out, "[50000.5,49999.5,", 17);
    assert_memory_equal(out + out_len - 5, ",1.5]", 5);
    free(out);
    free(in);
    free(want);
}

/* ---- The parsed document ---- */

/* The canonical form of every valid case is jcs_canonicalize's, however often it is asked for,
 * and every refused case fails as jcs_canonicalize does, leaving no document. */
static void test_doc_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof ok_cases / sizeof ok_cases[0]; i++) {
        const struct ok_case *c = &ok_cases[i];
        struct jcs_doc *doc = parse_len(c->in, c->len ? c->len : strlen(c->in));
        for (int round = 0; round < 2; round++) {
            char *out = NULL;
            size_t out_len = 0;
            assert_int_equal(jcs_doc_canonical(doc, &out, &out_len), 0);
            assert_int_equal(out_len, strlen(c->out));
            assert_memory_equal(out, c->out, out_len);
            free(out);
        }
        jcs_doc_free(doc);
    }
    for (size_t i = 0; i < sizeof err_cases / sizeof err_cases[0]; i++) {
        const struct err_case *c = &err_cases[i];
        size_t len = c->len ? c->len : strlen(c->in);
        char *copy = heap_copy(c->in, len);
        struct jcs_doc *doc = (struct jcs_doc *)&doc;
        struct jcs_error err = {0, 0, NULL};
        int rc = jcs_parse(copy, len, DEPTH, &doc, &err);
        if (rc != c->code || err.offset != c->offset || err.code != rc)
            fail_msg("case %zu: got %s at %zu", i, jcs_strerror(rc), err.offset);
        assert_null(doc);
        assert_int_equal(jcs_parse(copy, len, DEPTH, &doc, NULL), c->code);
        free(copy);
    }
    jcs_doc_free(NULL);
}

struct compact_case {
    const char *in, *want;
};

static const struct compact_case compact_cases[] = {
    {" { \"a\" : 1 ,\n \"b\":[ 1 , 2 ] }\t", "{\"a\":1,\"b\":[1,2]}"},
    /* Whitespace, quotes and backslashes inside strings stay. */
    {"{\"s\": \" keep  spaces \\\" and \\\\ \"}", "{\"s\":\" keep  spaces \\\" and \\\\ \"}"},
    {"[\"\\\\\", \" \\t\\n \", \"\\\"\" ]", "[\"\\\\\",\" \\t\\n \",\"\\\"\"]"},
    /* Numbers, escapes and member order exactly as written. */
    {"{\"seed\": 12345678901234567890, \"x\": 1.50, \"e\" : -0.0E+00}",
     "{\"seed\":12345678901234567890,\"x\":1.50,\"e\":-0.0E+00}"},
    {"{\"z\" : {} , \"a\" : [ ] , \"\\u00e9\" : \"\\u0020\\/\" }",
     "{\"z\":{},\"a\":[],\"\\u00e9\":\"\\u0020\\/\"}"},
    {"\r\n\t 7 \r\n\t", "7"},
    {"[ true , false , null ]", "[true,false,null]"},
    {"\"\"", "\"\""},
    {"{}", "{}"},
};

/* The compacted bytes: the input minus the whitespace between tokens, handed over once. */
static void test_doc_compact(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof compact_cases / sizeof compact_cases[0]; i++) {
        struct jcs_doc *doc = parse_ok(compact_cases[i].in);
        size_t len = 7;
        char *c = jcs_doc_take_compact(doc, &len);
        assert_non_null(c);
        assert_string_equal(c, compact_cases[i].want);
        assert_int_equal(len, strlen(compact_cases[i].want));
        assert_null(jcs_doc_take_compact(doc, &len));
        assert_int_equal(len, 0);
        /* The document does not need them: canonical form and navigation still work. */
        char *canon = NULL, *want = canon_ok(compact_cases[i].in);
        size_t clen = 0;
        assert_int_equal(jcs_doc_canonical(doc, &canon, &clen), 0);
        assert_string_equal(canon, want);
        assert_non_null(jcs_doc_root(doc));
        free(canon);
        free(want);
        free(c);
        jcs_doc_free(doc);
    }
}

struct nav_case {
    const char *in;
    const char *steps; /* '/'-separated: a member name, or #i for jcs_node_at(i); "" the root */
    int type;          /* enum jcs_type, or -1 for no node */
    size_t count;      /* jcs_node_count */
    double num;        /* JCS_NUMBER */
    const char *str;   /* JCS_STRING, slen bytes (0: strlen) */
    size_t slen;
};

static const struct nav_case nav_cases[] = {
    {"{\"b\":1,\"a\":[2,3]}", "", JCS_OBJECT, 2, 0, NULL, 0},
    /* Members are numbered in canonical order, not as written. */
    {"{\"b\":1,\"a\":[2,3]}", "#0", JCS_ARRAY, 2, 0, NULL, 0},
    {"{\"b\":1,\"a\":[2,3]}", "#1", JCS_NUMBER, 0, 1, NULL, 0},
    {"{\"b\":1,\"a\":[2,3]}", "#2", -1, 0, 0, NULL, 0},
    {"{\"b\":1,\"a\":[2,3]}", "a/#1", JCS_NUMBER, 0, 3, NULL, 0},
    {"{\"b\":1,\"a\":[2,3]}", "a/#2", -1, 0, 0, NULL, 0},
    {"{\"b\":1,\"a\":[2,3]}", "b", JCS_NUMBER, 0, 1, NULL, 0},
    {"{\"b\":1,\"a\":[2,3]}", "c", -1, 0, 0, NULL, 0},
    {"{\"b\":1,\"a\":[2,3]}", "B", -1, 0, 0, NULL, 0},
    /* UTF-16 order: U+1F600 (a surrogate pair, 0xD83D...) sorts before U+E000. */
    {"{\"\\ue000\":1,\"\\ud83d\\ude00\":2}", "#0", JCS_NUMBER, 0, 2, NULL, 0},
    {"{\"\\ue000\":1,\"\\ud83d\\ude00\":2}", "\xee\x80\x80", JCS_NUMBER, 0, 1, NULL, 0},
    /* Names and strings are decoded. */
    {"{\"\\u00e9\":\"x\\ty\"}", "\xc3\xa9", JCS_STRING, 0, 0, "x\ty", 0},
    {"{\"s\":\"a\\u0000b\"}", "s", JCS_STRING, 0, 0, "a\0b", 3},
    {"{\"s\":\"\"}", "s", JCS_STRING, 0, 0, "", 0},
    {"[true,false,null,{}]", "#0", JCS_TRUE, 0, 0, NULL, 0},
    {"[true,false,null,{}]", "#1", JCS_FALSE, 0, 0, NULL, 0},
    {"[true,false,null,{}]", "#2", JCS_NULL, 0, 0, NULL, 0},
    {"[true,false,null,{}]", "#3", JCS_OBJECT, 0, 0, NULL, 0},
    /* Numbers are their nearest double (compared bit for bit: -0 is -0.0). */
    {"[-0,1.5E+2,1e-400,9007199254740993,0.1]", "#0", JCS_NUMBER, 0, -0.0, NULL, 0},
    {"[-0,1.5E+2,1e-400,9007199254740993,0.1]", "#1", JCS_NUMBER, 0, 150, NULL, 0},
    {"[-0,1.5E+2,1e-400,9007199254740993,0.1]", "#2", JCS_NUMBER, 0, 0, NULL, 0},
    {"[-0,1.5E+2,1e-400,9007199254740993,0.1]", "#3", JCS_NUMBER, 0, 9007199254740992.0, NULL, 0},
    {"[-0,1.5E+2,1e-400,9007199254740993,0.1]", "#4", JCS_NUMBER, 0, 0.1, NULL, 0},
    {"1.7976931348623157e308", "", JCS_NUMBER, 0, 1.7976931348623157e308, NULL, 0},
    /* Steps that do not fit select nothing. */
    {"[1]", "a", -1, 0, 0, NULL, 0},
    {"\"s\"", "#0", -1, 0, 0, NULL, 0},
    {"{\"a\":1}", "a/#0", -1, 0, 0, NULL, 0},
};

/* Follows one '/'-separated step from n. */
static const struct jcs_node *nav_step(const struct jcs_doc *doc, const struct jcs_node *n,
                                       const char *step, size_t len)
{
    if (len > 1 && step[0] == '#')
        return jcs_node_at(doc, n, (size_t)strtoul(step + 1, NULL, 10));
    return jcs_node_member(doc, n, step, len);
}

static void test_doc_navigation(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof nav_cases / sizeof nav_cases[0]; i++) {
        const struct nav_case *c = &nav_cases[i];
        struct jcs_doc *doc = parse_ok(c->in);
        const struct jcs_node *n = jcs_doc_root(doc);
        for (const char *st = c->steps; *st;) {
            size_t len = strcspn(st, "/");
            n = nav_step(doc, n, st, len);
            st += len + (st[len] == '/');
        }
        print_message("nav %zu: %s %s\n", i, c->in, c->steps);
        if (c->type < 0) {
            assert_null(n);
            jcs_doc_free(doc);
            continue;
        }
        assert_non_null(n);
        assert_int_equal(jcs_node_type(n), c->type);
        assert_int_equal(jcs_node_count(n), c->count);
        double v = -99;
        size_t slen = 99;
        const char *s = jcs_node_string(doc, n, &slen);
        assert_int_equal(jcs_node_number(doc, n, &v), c->type == JCS_NUMBER ? 0 : -1);
        if (c->type == JCS_NUMBER && memcmp(&v, &c->num, sizeof v))
            fail_msg("nav %zu: %.17g, want %.17g", i, v, c->num);
        if (c->type != JCS_STRING) {
            assert_null(s);
            assert_int_equal(slen, 0);
        } else {
            assert_int_equal(slen, c->slen ? c->slen : strlen(c->str));
            assert_memory_equal(s, c->str, slen);
        }
        jcs_doc_free(doc);
    }
}

/* Member lookup is a binary search in canonical order: it finds every member of a large object
 * whose names cross the UTF-16 ordering traps, and nothing else. */
static void test_doc_member(void **state)
{
    (void)state;
    static const char *const prefixes[] = {
        "k", "\xc3\xa9", "\xee\x80\x80", "\xef\xbf\xbd", "\xf0\x9f\x98\x80", "K", ""};
    const unsigned per = 150, np = sizeof prefixes / sizeof prefixes[0];
    char *in = malloc((size_t)per * np * 32 + 8);
    assert_non_null(in);
    size_t a = 0;
    in[a++] = '{';
    for (unsigned i = 0; i < per * np; i++) {
        unsigned k = (i * 7919u) % (per * np); /* a scrambled order */
        a += (size_t)sprintf(in + a, "%s\"%s%u\":%u", i ? "," : "", prefixes[k % np], k / np, k);
    }
    in[a++] = '}';
    in[a] = '\0';
    struct jcs_doc *doc = parse_ok(in);
    const struct jcs_node *root = jcs_doc_root(doc);
    assert_int_equal(jcs_node_count(root), per * np);
    for (unsigned k = 0; k < per * np; k++) {
        char name[32];
        double v = -1;
        int len = snprintf(name, sizeof name, "%s%u", prefixes[k % np], k / np);
        assert_int_equal(jcs_node_number(doc, jcs_node_member(doc, root, name, (size_t)len), &v),
                         0);
        assert_true(v == k);
    }
    static const struct {
        const char *name;
        size_t len;
    } absent[] = {{"k", 1}, {"k1000", 5}, {"k1\0", 3}, {"\xff", 1}, {"\xee\x80", 2}, {"", 0}};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
        assert_null(jcs_node_member(doc, root, absent[i].name, absent[i].len));
    assert_null(jcs_node_member(doc, NULL, "k1", 2));
    assert_null(jcs_node_at(doc, NULL, 0));
    assert_int_equal(jcs_node_count(NULL), 0);
    jcs_doc_free(doc);
    free(in);
}

static void test_strerror(void **state)
{
    (void)state;
    assert_string_equal(jcs_strerror(JCS_OK), "ok");
    assert_string_equal(jcs_strerror(JCS_ENOMEM), "out_of_memory");
    assert_string_equal(jcs_strerror(JCS_ESYNTAX), "syntax_error");
    assert_string_equal(jcs_strerror(JCS_EDUPKEY), "duplicate_key");
    assert_string_equal(jcs_strerror(JCS_ENUMBER), "invalid_number");
    assert_string_equal(jcs_strerror(JCS_EDEPTH), "too_deep");
    assert_string_equal(jcs_strerror(JCS_EUTF8), "invalid_utf8");
    assert_string_equal(jcs_strerror(JCS_ETRAILING), "trailing_data");
    assert_string_equal(jcs_strerror(-99), "unknown_error");
    assert_string_equal(jcs_strerror(5), "unknown_error");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ok_table),
        cmocka_unit_test(test_err_table),
        cmocka_unit_test(test_err_null),
        cmocka_unit_test(test_number_table),
        cmocka_unit_test(test_format_nonfinite),
        cmocka_unit_test(test_number_locale),
        cmocka_unit_test(test_number_exact),
        cmocka_unit_test(test_number_random),
        cmocka_unit_test(test_equivalence),
        cmocka_unit_test(test_value_change),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_depth_hostile),
        cmocka_unit_test(test_large),
        cmocka_unit_test(test_doc_cases),
        cmocka_unit_test(test_doc_compact),
        cmocka_unit_test(test_doc_navigation),
        cmocka_unit_test(test_doc_member),
        cmocka_unit_test(test_strerror),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
