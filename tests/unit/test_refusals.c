/* What a refused request is told (issue 24 §12): which part of a reused key's request differed
 * (fp_mismatch), and which providers or routes exist when the target is unknown
 * (cfg_explain_unknown_target). Table-driven. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/config.h"
#include "idemgate/fingerprint.h"

static void test_mismatch(void **state)
{
    (void)state;
    static const struct {
        const char *sp, *sr, *p, *r, *want;
    } cases[] = {
        {"mock", "images/generations", "other", "images/generations", "provider"},
        {"mock", "images/generations", "other", "videos", "provider"}, /* the first that differs */
        {"mock", "images/generations", "mock", "videos", "route"},
        {"mock", "images/generations", "mock", "images/generations", "body"},
        {NULL, NULL, "", "", "body"},
        {NULL, "x", "", "", "route"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_string_equal(fp_mismatch(cases[i].sp, cases[i].sr, cases[i].p, cases[i].r),
                            cases[i].want);
}

static void test_unknown_target(void **state)
{
    (void)state;
    struct cfg_route r1[] = {{.route = "images/generations"}, {.route = "images/edits"}};
    struct cfg_provider ps[] = {{.name = "openai", .routes = r1, .n_routes = 2},
                                {.name = "replicate"}};
    struct cfg c = {.providers = ps, .n_providers = 2};
    static const struct {
        const char *target, *want;
    } cases[] = {
        {"opnai/images/generations",
         "no provider \"opnai\" is configured; the providers: openai, replicate"},
        {"openai/images/variations",
         "provider \"openai\" has no route \"images/variations\"; its routes: images/generations, "
         "images/edits"},
        {"openai", "provider \"openai\" has no route \"\"; its routes: images/generations, "
                   "images/edits"},
        {"replicate/x", "provider \"replicate\" has no route \"x\"; its routes: "},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[400];
        cfg_explain_unknown_target(&c, cases[i].target, out, sizeof(out));
        assert_string_equal(out, cases[i].want);
    }
    /* Cut to fit, always terminated. */
    char small[24];
    cfg_explain_unknown_target(&c, "nope/x", small, sizeof(small));
    assert_int_equal(strlen(small), sizeof(small) - 1);
    struct cfg none = {0};
    char out[128];
    cfg_explain_unknown_target(&none, "x/y", out, sizeof(out));
    assert_string_equal(out, "no provider \"x\" is configured; the providers: none");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_unknown_target),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
