/* The pure parts of the tenant limits: the token bucket, defaults, Retry-After. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "idemgate/limits.h"

static void test_bucket(void **state)
{
    (void)state;
    /* One step after another on the same bucket: (now, rate, burst) → seconds to wait. */
    static const struct {
        double now, rate, burst, wait;
    } steps[] = {
        {100.0, 2, 3, 0},      /* a new bucket starts full: 3 at once */
        {100.0, 2, 3, 0},
        {100.0, 2, 3, 0},
        {100.0, 2, 3, 0.5},    /* empty: one token comes in 1/rate s */
        {100.25, 2, 3, 0.25},  /* half a token came */
        {100.5, 2, 3, 0},      /* one token came */
        {110.0, 2, 3, 0},      /* a long pause refills to the burst, not beyond */
        {110.0, 2, 3, 0},
        {110.0, 2, 3, 0},
        {110.0, 2, 3, 0.5},
        {109.0, 2, 3, 0.5},    /* the clock stepped back: nothing refills */
        {120.0, 0, 0, 0},      /* no rate: no limit */
        {120.0, 1, 0, 0},      /* a burst below 1 counts as 1 */
        {120.0, 1, 0, 1.0},
    };
    struct lim_bucket b = {0};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        double w = lim_take(&b, steps[i].now, steps[i].rate, steps[i].burst);
        if (w < steps[i].wait - 1e-9 || w > steps[i].wait + 1e-9)
            fail_msg("step %zu: waited %f, wanted %f", i, w, steps[i].wait);
    }
}

static void test_values(void **state)
{
    (void)state;
    assert_int_equal(lim_value(-1, 7), 7);
    assert_int_equal(lim_value(0, 7), 0); /* a tenant's own 0: no limit for it */
    assert_int_equal(lim_value(3, 7), 3);
    assert_int_equal(lim_retry_after(0.0), 1);
    assert_int_equal(lim_retry_after(0.2), 1);
    assert_int_equal(lim_retry_after(1.0), 1);
    assert_int_equal(lim_retry_after(1.01), 2);
    assert_int_equal(lim_retry_after(1e9), 3600);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_bucket),
                                       cmocka_unit_test(test_values)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
