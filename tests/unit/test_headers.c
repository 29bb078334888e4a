/* Table-driven tests of the header parsers (Idempotency-Key, Bearer, Prefer). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/headers.h"

struct key_case {
    const char *in;
    const char *want; /* NULL: invalid */
    size_t len;       /* bytes of in; 0: strlen(in) (a case holding a NUL gives its length) */
};

static const struct key_case key_cases[] = {
    {"abc", "abc", 0},
    {"order-123:v2", "order-123:v2", 0},
    {"\"abc\"", "abc", 0},
    {"\"a\\\"b\"", "a\"b", 0},
    {"\"a\\\\b\"", "a\\b", 0},
    {"\"with space\"", "with space", 0},
    {"in ner", "in ner", 0},
    {"~!@#$%^&*()", "~!@#$%^&*()", 0},
    {"", NULL, 0},
    {"\"\"", NULL, 0},
    {"\"open", NULL, 0},
    {"\"a\"b", NULL, 0},
    {"\"a\";p=1", NULL, 0},
    {"\"a\\nb\"", NULL, 0},
    {"tab\there", NULL, 0},
    {"nl\nhere", NULL, 0},
    {"cr\rhere", NULL, 0},
    {"del\x7f", NULL, 0},
    {"caf\xc3\xa9", NULL, 0},
    {" lead", NULL, 0},
    {"trail ", NULL, 0},
    /* The length, not a NUL, ends the value. */
    {"abcdef", "abc", 3},
    {"\"abc\"def", "abc", 5},
    {"\"abc", NULL, 4},
    {"\"a\\", NULL, 3},
};

static void test_idempotency_key(void **state)
{
    (void)state;
    char out[HDR_KEY_MAX + 1];
    for (size_t i = 0; i < sizeof(key_cases) / sizeof(key_cases[0]); i++) {
        const struct key_case *c = &key_cases[i];
        int n = hdr_idempotency_key(c->in, c->len ? c->len : strlen(c->in), out);
        if (c->want) {
            if (n != (int)strlen(c->want) || strcmp(out, c->want) != 0)
                fail_msg("case %zu: got %d, want \"%s\"", i, n, c->want);
        } else if (n != -1) {
            fail_msg("case %zu: got %d (\"%s\"), want a refusal", i, n, out);
        }
    }
}

/* Issue 21 item 10: a NUL inside the value is a byte outside the allowed set, wherever it is.
 * The key is never what comes before it: "abc\0def" and "abc\0xyz" were one key ("abc"). */
static const struct {
    const char *in;
    size_t len;
} nul_cases[] = {
    {"abc\0def", 7},  {"abc\0xyz", 7},         {"abc\0", 4},           {"\0abc", 4}, {"\0", 1},
    {"\"abc\0def\"", 9}, {"\"abc\"\0", 6}, {"\"ab\\\0\"", 6},
};

static void test_key_with_nul_refused(void **state)
{
    (void)state;
    char out[HDR_KEY_MAX + 1];
    for (size_t i = 0; i < sizeof(nul_cases) / sizeof(nul_cases[0]); i++) {
        int n = hdr_idempotency_key(nul_cases[i].in, nul_cases[i].len, out);
        if (n != -1)
            fail_msg("case %zu: a value holding a NUL gave the key \"%s\"", i, out);
    }
}

static void test_idempotency_key_length_bounds(void **state)
{
    (void)state;
    char in[300], quoted[310], out[HDR_KEY_MAX + 1];
    memset(in, 'k', 255);
    in[255] = '\0';
    assert_int_equal(hdr_idempotency_key(in, strlen(in), out), 255);
    snprintf(quoted, sizeof(quoted), "\"%s\"", in);
    assert_int_equal(hdr_idempotency_key(quoted, strlen(quoted), out), 255);
    in[255] = 'k';
    in[256] = '\0';
    assert_int_equal(hdr_idempotency_key(in, strlen(in), out), -1);
    snprintf(quoted, sizeof(quoted), "\"%s\"", in);
    assert_int_equal(hdr_idempotency_key(quoted, strlen(quoted), out), -1);
    assert_int_equal(hdr_idempotency_key(NULL, 0, out), -1);
    assert_int_equal(hdr_idempotency_key("abc", 0, out), -1);
}

static void test_bearer(void **state)
{
    (void)state;
    size_t len;
    const char *t = hdr_bearer("Bearer abc.def", &len);
    assert_non_null(t);
    assert_int_equal(len, 7);
    assert_memory_equal(t, "abc.def", 7);
    t = hdr_bearer("bearer   tok  ", &len);
    assert_non_null(t);
    assert_int_equal(len, 3);
    assert_null(hdr_bearer("Basic abc", &len));
    assert_null(hdr_bearer("Bearer ", &len));
    assert_null(hdr_bearer("Bearer a b", &len));
    assert_null(hdr_bearer("Bearerabc", &len));
    assert_null(hdr_bearer(NULL, &len));
}

/* Issue 10 D17: a long tenant token is accepted whole (it was refused beyond 512 bytes, which
 * read as a wrong token). */
static void test_bearer_has_no_length_limit(void **state)
{
    (void)state;
    static const size_t sizes[] = {1, 512, 513, 2048, 4096, 65536};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t n = sizes[i], len = 0;
        char *v = test_malloc(7 + n + 3);
        memcpy(v, "Bearer ", 7);
        for (size_t j = 0; j < n; j++)
            v[7 + j] = (char)('!' + j % 94); /* every visible ASCII character */
        memcpy(v + 7 + n, "  ", 3);          /* trailing spaces are not part of it */
        const char *t = hdr_bearer(v, &len);
        assert_ptr_equal(t, v + 7);
        assert_int_equal(len, n);
        v[7 + n / 2] = ' '; /* still one token: a space inside is refused, whatever the size */
        if (n > 1)
            assert_null(hdr_bearer(v, &len));
        v[7 + n / 2] = '\x7f';
        assert_null(hdr_bearer(v, &len));
        test_free(v);
    }
}

struct prefer_case {
    const char *in;
    int cap;
    int want;
};

static const struct prefer_case prefer_cases[] = {
    {"wait=10", 60, 10},
    {"respond-async, wait=5", 60, 5},
    {"wait = 7", 60, 7},
    {"wait=\"3\"", 60, 3},
    {"wait=600", 60, 60},
    {"wait=99999999999999999999", 60, 60},
    {"return=minimal", 60, 0},
    {"wait=", 60, 0},
    {"wait=x", 60, 0},
    {"waiting=4", 60, 0},
    {"", 60, 0},
    {NULL, 60, 0},
};

static void test_prefer_wait(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(prefer_cases) / sizeof(prefer_cases[0]); i++)
        assert_int_equal(hdr_prefer_wait(prefer_cases[i].in, prefer_cases[i].cap),
                         prefer_cases[i].want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idempotency_key),
        cmocka_unit_test(test_idempotency_key_length_bounds),
        cmocka_unit_test(test_key_with_nul_refused),
        cmocka_unit_test(test_bearer),
        cmocka_unit_test(test_bearer_has_no_length_limit),
        cmocka_unit_test(test_prefer_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
