/* Table-driven tests of rawpath_check: which raw request paths the router refuses (issue 21
 * item 9: routing after percent-decoding let "/%761/admin/providers", "/v1%2Fadmin%2Fproviders",
 * "/v1/admin/providers%00.css", "/metrics%00" and "/%6detrics" reach their handlers). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/rawpath.h"

static const struct {
    const char *path;
    enum rawpath_verdict want;
} cases[] = {
    /* The API's own paths. */
    {"/healthz", RAWPATH_OK},
    {"/v1/jobs/job_abc/outputs/0", RAWPATH_OK},
    {"/v1/providers/openai/images/generations", RAWPATH_OK},
    {"/console/app.js", RAWPATH_OK},
    {"/", RAWPATH_OK},
    /* The paths: refused, or kept as sent so that they match nothing. */
    {"/%761/admin/providers", RAWPATH_OK},
    {"/%6detrics", RAWPATH_OK},
    {"/v1%2Fadmin%2Fproviders", RAWPATH_ENCODED_SLASH},
    {"/v1%2fadmin%2fproviders", RAWPATH_ENCODED_SLASH},
    {"/v1/admin/providers%00.css", RAWPATH_NUL},
    {"/metrics%00", RAWPATH_NUL},
    {"/v1%5Cadmin", RAWPATH_ENCODED_SLASH},
    {"/v1\\admin", RAWPATH_CONTROL},
    /* Dot segments, raw or encoded, anywhere. */
    {"/v1/../metrics", RAWPATH_DOT_SEGMENT},
    {"/v1/./jobs", RAWPATH_DOT_SEGMENT},
    {"/v1/jobs/..", RAWPATH_DOT_SEGMENT},
    {"/v1/jobs/.", RAWPATH_DOT_SEGMENT},
    {"/..", RAWPATH_DOT_SEGMENT},
    {"/v1/%2e%2e/metrics", RAWPATH_DOT_SEGMENT},
    {"/v1/%2E./metrics", RAWPATH_DOT_SEGMENT},
    {"/v1/.%2e", RAWPATH_DOT_SEGMENT},
    {"/v1/%2e/jobs", RAWPATH_DOT_SEGMENT},
    /* Dots that are no dot segment. */
    {"/console/app.min.js", RAWPATH_OK},
    {"/v1/.../x", RAWPATH_OK},
    {"/v1/..a/x", RAWPATH_OK},
    {"/v1/.well-known", RAWPATH_OK},
    {"/v1//jobs", RAWPATH_OK},
    /* Malformed escapes. */
    {"/v1/%", RAWPATH_BAD_ESCAPE},
    {"/v1/%4", RAWPATH_BAD_ESCAPE},
    {"/v1/%zz", RAWPATH_BAD_ESCAPE},
    {"/v1/%g1/x", RAWPATH_BAD_ESCAPE},
    /* Control and non-ASCII bytes, raw or encoded. */
    {"/v1/a b", RAWPATH_CONTROL},
    {"/v1/a%20b", RAWPATH_CONTROL},
    {"/v1/a%0d%0aSet-Cookie:x", RAWPATH_CONTROL},
    {"/v1/a\x7f", RAWPATH_CONTROL},
    {"/v1/caf\xc3\xa9", RAWPATH_CONTROL},
    {"/v1/caf%C3%A9", RAWPATH_CONTROL},
    {"/v1/a\tb", RAWPATH_CONTROL},
    /* Not origin-form. */
    {"", RAWPATH_NOT_ORIGIN},
    {"*", RAWPATH_NOT_ORIGIN},
    {"http://x/v1/admin/providers", RAWPATH_NOT_ORIGIN},
    {"v1/jobs", RAWPATH_NOT_ORIGIN},
};

static void test_routing_on_raw_path(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        enum rawpath_verdict got = rawpath_check(cases[i].path, strlen(cases[i].path));
        if (got != cases[i].want)
            fail_msg("case %zu (%s): got %s, want %s", i, cases[i].path,
                     rawpath_verdict_name(got), rawpath_verdict_name(cases[i].want));
    }
}

/* The length bounds the path: what follows it (the query, or garbage) is never read. */
static void test_raw_path_length_is_the_bound(void **state)
{
    (void)state;
    assert_int_equal(rawpath_check("/metrics%00", 8), RAWPATH_OK);
    assert_int_equal(rawpath_check("/v1/%2e%2e", 6), RAWPATH_BAD_ESCAPE);
    assert_int_equal(rawpath_check("/v1/%2e%2e", 7), RAWPATH_DOT_SEGMENT);
    assert_int_equal(rawpath_check("/v1/..x", 6), RAWPATH_DOT_SEGMENT);
    assert_int_equal(rawpath_check("/a", 0), RAWPATH_NOT_ORIGIN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routing_on_raw_path),
        cmocka_unit_test(test_raw_path_length_is_the_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
