/* Table-driven tests of rl_uri_check: which request targets the transport refuses before
 * libmicrohttpd parses their query (issue 14 §5: ≈ 480 parameters hung the connection). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/reqlimit.h"

/* A target: prefix, then n times piece joined by sep, then padding up to pad_to bytes. */
struct uri_case {
    const char *prefix;
    const char *piece;
    const char *sep;
    int n;
    size_t pad_to; /* 0: no padding; the padding is 'x' appended to the last piece */
    enum rl_uri_verdict want;
};

static const struct uri_case cases[] = {
    {"/healthz", "", "", 0, 0, RL_URI_OK},
    {"/healthz?", "", "", 0, 0, RL_URI_OK},
    {"/v1/jobs?", "state=review", "&", 1, 0, RL_URI_OK},
    {"/v1/jobs?", "a=b", "&", 64, 0, RL_URI_OK},
    {"/v1/jobs?", "a=b", "&", 65, 0, RL_URI_TOO_MANY_PARAMS},
    {"/healthz?", "a=b", "&", 500, 0, RL_URI_TOO_MANY_PARAMS},
    {"/healthz?", "a", "&", 2000, 0, RL_URI_TOO_MANY_PARAMS},
    /* 64 separators: 65 pieces, empty ones count (libmicrohttpd makes a record of each). */
    {"/healthz?", "", "&", 65, 0, RL_URI_TOO_MANY_PARAMS},
    {"/healthz?", "", "&", 64, 0, RL_URI_OK},
    /* '&' in the path is not a separator; a second '?' is part of the query. */
    {"/a&b&c&d", "", "", 0, 0, RL_URI_OK},
    {"/healthz?a=?&", "b", "&", 63, 0, RL_URI_OK},
    {"/healthz?a=?&", "b", "&", 64, 0, RL_URI_TOO_MANY_PARAMS},
    /* ';' is no separator to libmicrohttpd. */
    {"/healthz?", "a=b", ";", 500, 0, RL_URI_OK},
    /* Length: up to RL_URI_MAX_BYTES, in the path or in one long value. */
    {"/healthz?a=", "", "", 0, RL_URI_MAX_BYTES, RL_URI_OK},
    {"/healthz?a=", "", "", 0, RL_URI_MAX_BYTES + 1, RL_URI_TOO_LONG},
    {"/x", "", "", 0, RL_URI_MAX_BYTES + 1, RL_URI_TOO_LONG},
    {"/x", "", "", 0, RL_URI_MAX_BYTES, RL_URI_OK},
};

static char *build(const struct uri_case *c, size_t *len)
{
    size_t cap =
        strlen(c->prefix) + (size_t)c->n * (strlen(c->piece) + strlen(c->sep)) + c->pad_to + 1;
    char *s = malloc(cap);
    assert_non_null(s);
    strcpy(s, c->prefix);
    for (int i = 0; i < c->n; i++) {
        if (i)
            strcat(s, c->sep);
        strcat(s, c->piece);
    }
    size_t n = strlen(s);
    while (n < c->pad_to)
        s[n++] = 'x';
    s[n] = '\0';
    *len = n;
    return s;
}

static void test_uri_check(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t len;
        char *uri = build(&cases[i], &len);
        enum rl_uri_verdict got = rl_uri_check(uri, len);
        if (got != cases[i].want)
            fail_msg("case %zu (%s… %zu bytes): got %s, want %s", i, cases[i].prefix, len,
                     rl_uri_verdict_name(got), rl_uri_verdict_name(cases[i].want));
        free(uri);
    }
}

/* Only uri[0..len) is read: what follows (here 100 more separators) does not count. */
static void test_uri_check_reads_only_len(void **state)
{
    (void)state;
    char buf[256] = "/healthz?a";
    size_t n = strlen(buf);
    memset(buf + n, '&', 100);
    buf[n + 100] = '\0';
    assert_int_equal(rl_uri_check(buf, n), RL_URI_OK);
    assert_int_equal(rl_uri_check(buf, n + 100), RL_URI_TOO_MANY_PARAMS);
    assert_int_equal(rl_uri_check("", 0), RL_URI_OK);
}

static void test_verdict_names(void **state)
{
    (void)state;
    assert_string_equal(rl_uri_verdict_name(RL_URI_OK), "ok");
    assert_string_equal(rl_uri_verdict_name(RL_URI_TOO_LONG), "uri_too_long");
    assert_string_equal(rl_uri_verdict_name(RL_URI_TOO_MANY_PARAMS), "too_many_query_parameters");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uri_check),
        cmocka_unit_test(test_uri_check_reads_only_len),
        cmocka_unit_test(test_verdict_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
