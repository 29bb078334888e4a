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
};

static const struct key_case key_cases[] = {
    {"abc", "abc"},
    {"order-123:v2", "order-123:v2"},
    {"\"abc\"", "abc"},
    {"\"a\\\"b\"", "a\"b"},
    {"\"a\\\\b\"", "a\\b"},
    {"\"with space\"", "with space"},
    {"in ner", "in ner"},
    {"~!@#$%^&*()", "~!@#$%^&*()"},
    {"", NULL},
    {"\"\"", NULL},
    {"\"open", NULL},
    {"\"a\"b", NULL},
    {"\"a\";p=1", NULL},
    {"\"a\\nb\"", NULL},
    {"tab\there", NULL},
    {"nl\nhere", NULL},
    {"cr\rhere", NULL},
    {"del\x7f", NULL},
    {"caf\xc3\xa9", NULL},
    {" lead", NULL},
    {"trail ", NULL},
};

static void test_idempotency_key(void **state)
{
    (void)state;
    char out[HDR_KEY_MAX + 1];
    for (size_t i = 0; i < sizeof(key_cases) / sizeof(key_cases[0]); i++) {
        int n = hdr_idempotency_key(key_cases[i].in, out);
        if (key_cases[i].want) {
            assert_int_equal(n, (int)strlen(key_cases[i].want));
            assert_string_equal(out, key_cases[i].want);
        } else {
            assert_int_equal(n, -1);
        }
    }
}

static void test_idempotency_key_length_bounds(void **state)
{
    (void)state;
    char in[300], quoted[310], out[HDR_KEY_MAX + 1];
    memset(in, 'k', 255);
    in[255] = '\0';
    assert_int_equal(hdr_idempotency_key(in, out), 255);
    snprintf(quoted, sizeof(quoted), "\"%s\"", in);
    assert_int_equal(hdr_idempotency_key(quoted, out), 255);
    in[255] = 'k';
    in[256] = '\0';
    assert_int_equal(hdr_idempotency_key(in, out), -1);
    snprintf(quoted, sizeof(quoted), "\"%s\"", in);
    assert_int_equal(hdr_idempotency_key(quoted, out), -1);
    assert_int_equal(hdr_idempotency_key(NULL, out), -1);
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
        cmocka_unit_test(test_bearer),
        cmocka_unit_test(test_bearer_has_no_length_limit),
        cmocka_unit_test(test_prefer_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
