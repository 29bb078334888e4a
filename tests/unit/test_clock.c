/* The lease's send deadline, read on two clocks (clock_deadline): passed once either the
 * monotonic clock or the wall clock says so, one table row per case. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "idemgate/clock.h"

#define N_ROWS(a) (sizeof(a) / sizeof((a)[0]))

struct dl_case {
    const char *name;
    double mono_after; /* seconds each clock moved on since the deadline was set (60 s ahead) */
    double wall_after;
    int passed;
};

static void test_deadline_on_two_clocks(void **state)
{
    (void)state;
    static const struct dl_case cases[] = {
        {"neither clock reached it", 59.0, 59.0, 0},
        {"exactly at it on both", 60.0, 60.0, 0},
        {"the process stopped: both clocks went on", 600.0, 600.0, 1},
        /* A virtual machine paused, or a host suspended, where the monotonic clock did not
         * count the pause: the wall clock, set forward once it resumed, did. */
        {"a pause the monotonic clock missed", 2.0, 602.0, 1},
        /* The wall clock set back (a correction): the monotonic clock still counts. */
        {"the wall clock set back", 61.0, -300.0, 1},
        {"the wall clock set back, within the lease", 30.0, -300.0, 0},
        /* The wall clock set forward for another reason: the request is not sent (it is
         * released, sent later by whoever claims it), never sent late. */
        {"the wall clock set forward an hour", 1.0, 3601.0, 1},
    };
    const double mono0 = 1000.0, wall0 = 1.7e9;
    for (size_t i = 0; i < N_ROWS(cases); i++) {
        struct clock_deadline d = clock_deadline_in(60.0, mono0, wall0);
        int got = clock_deadline_passed(&d, mono0 + cases[i].mono_after,
                                        wall0 + cases[i].wall_after);
        if (got != cases[i].passed)
            fail_msg("%s: passed %d, want %d", cases[i].name, got, cases[i].passed);
    }
}

static void test_clock_mono_is_monotonic(void **state)
{
    (void)state;
    double a = clock_mono();
    double b = clock_mono();
    assert_true(b >= a);
    assert_true(a > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deadline_on_two_clocks),
        cmocka_unit_test(test_clock_mono_is_monotonic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
