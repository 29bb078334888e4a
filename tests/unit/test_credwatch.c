/* Whether a provider's credential can be read on this replica (credwatch.h): the verdict and the
 * recheck as pure tables; the watch itself over a variable set, unset and set again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/config.h"
#include "idemgate/credwatch.h"

static void test_judge(void **state)
{
    (void)state;
    static const struct {
        const char *ref, *secret;
        enum cw_verdict want;
    } rows[] = {
        {"OPENAI_KEY", "sk-1", CW_USABLE},
        {"OPENAI_KEY", NULL, CW_UNSET},
        {"file:/run/secrets/k", NULL, CW_UNSET},
        {"OPENAI_KEY", "sk-1\n", CW_CONTROL_CHARACTER},
        {"OPENAI_KEY", "sk\x7f", CW_CONTROL_CHARACTER},
        {"", NULL, CW_USABLE}, /* a provider sending no credential lacks none */
        {NULL, NULL, CW_USABLE},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        enum cw_verdict got = cw_judge(rows[i].ref, rows[i].secret);
        if (got != rows[i].want)
            fail_msg("row %zu: %d, want %d", i, (int)got, (int)rows[i].want);
        if ((cw_reason(got) == NULL) != (got == CW_USABLE))
            fail_msg("row %zu: a reason only for an unusable credential", i);
    }
    assert_non_null(strstr(cw_reason(CW_UNSET), "credential is not set"));
}

static void test_stale(void **state)
{
    (void)state;
    static const struct {
        double read_ms, now_ms;
        int want;
    } rows[] = {
        {-1, 0, 1},                        /* never read */
        {1000, 1000, 0},                   /* just read */
        {1000, 1000 + CW_RECHECK_MS - 1, 0}, {1000, 1000 + CW_RECHECK_MS, 1},
        {5000, 4000, 1},                   /* a clock that went back: read again */
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (cw_stale(rows[i].read_ms, rows[i].now_ms) != rows[i].want)
            fail_msg("row %zu: want %d", i, rows[i].want);
}

static void test_watch_follows_the_variable(void **state)
{
    (void)state;
    struct cfg_provider p[2] = {{.name = "keyed", .credential = "IDEMGATE_TEST_CW_KEY"},
                                {.name = "open", .credential = ""}};
    struct cfg c = {.providers = p, .n_providers = 2};
    unsetenv("IDEMGATE_TEST_CW_KEY");
    struct credwatch *w = cw_new(&c);
    assert_non_null(w);
    assert_int_equal(cw_sendable(w, 0, 0), 0);
    assert_int_equal(cw_sendable(w, 1, 0), 1);
    assert_int_equal(cw_sendable(w, 7, 0), 1);  /* not configured here: not ours to say */
    assert_int_equal(cw_sendable(w, -1, 0), 1);
    setenv("IDEMGATE_TEST_CW_KEY", "sk-test", 1);
    assert_int_equal(cw_sendable(w, 0, CW_RECHECK_MS - 1), 0); /* kept until stale */
    assert_int_equal(cw_sendable(w, 0, CW_RECHECK_MS), 1);
    unsetenv("IDEMGATE_TEST_CW_KEY");
    assert_int_equal(cw_sendable(w, 0, CW_RECHECK_MS + 1), 1);
    cw_recheck(w, 0, CW_RECHECK_MS + 2); /* a send found it gone: at once */
    assert_int_equal(cw_sendable(w, 0, CW_RECHECK_MS + 3), 0);
    cw_free(w);
    assert_int_equal(cw_sendable(NULL, 0, 0), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_judge),
        cmocka_unit_test(test_stale),
        cmocka_unit_test(test_watch_follows_the_variable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
