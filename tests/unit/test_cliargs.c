/* The command line's options are checked before anything runs (cliargs.h): a misspelt option is
 * refused, never taken as "no option" (which clears a budget). Table-driven. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/cliargs.h"

static void test_check(void **state)
{
    (void)state;
    static const char *const valued[] = {"--day", "--month", "--currency", NULL};
    static const char *const flags[] = {"--clear", NULL};
    static const struct {
        const char *args[8];
        int first, ok;
        const char *bad, *why;
    } cases[] = {
        {{"budget", "acme", "--day", "10", NULL}, 2, 1, NULL, NULL},
        {{"budget", "acme", NULL}, 2, 1, NULL, NULL},
        {{"budget", "acme", "--day", "10", "--month", "none", "--currency", "USD"}, 2, 1, NULL,
         NULL},
        {{"budget", "acme", "--clear", NULL}, 2, 1, NULL, NULL},
        {{"budget", "acme", "--daily", "10", NULL}, 2, 0, "--daily", "unknown option"},
        {{"budget", "acme", "--day", NULL}, 2, 0, "--day", "wants a value"},
        {{"budget", "acme", "--day", "1", "--day", "2", NULL}, 2, 0, "--day", "given twice"},
        {{"budget", "acme", "--clear", "--clear", NULL}, 2, 0, "--clear", "given twice"},
        {{"budget", "acme", "10", NULL}, 2, 0, "10", "unexpected argument"},
        /* A value is taken whatever it looks like: a day of "--clear" is --day's to judge. */
        {{"budget", "acme", "--day", "--clear", NULL}, 2, 1, NULL, NULL},
        {{"budget", "acme", "--day", "--month", "--month", "1", NULL}, 2, 1, NULL, NULL},
        {{"budget", "acme", "--Day", "10", NULL}, 2, 0, "--Day", "unknown option"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int argc = 0;
        while (argc < 8 && cases[i].args[argc])
            argc++;
        const char *bad = "unset", *why = "unset";
        print_message("case %zu\n", i);
        int rc = cliargs_check(argc, (char **)cases[i].args, cases[i].first, valued, flags, &bad,
                               &why);
        assert_int_equal(rc, cases[i].ok ? 0 : -1);
        if (cases[i].ok) {
            assert_null(bad);
            assert_null(why);
        } else {
            assert_string_equal(bad, cases[i].bad);
            assert_string_equal(why, cases[i].why);
        }
    }
    const char *bad, *why;
    char *none[] = {"x", "--day", "1"};
    assert_int_equal(cliargs_check(3, none, 1, NULL, NULL, &bad, &why), -1);
    assert_string_equal(bad, "--day");
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_check)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
