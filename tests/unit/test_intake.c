/* The intake pipeline's pure parts: the order of its steps (authentication first, by
 * construction) and the gate that proves a caller a tenant before any 4xx. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/intake.h"

static void test_step_order(void **state)
{
    (void)state;
    static const char *const want[] = {"authenticate", "validate", "limit",  "canonicalise",
                                       "fingerprint",  "gate",     "cache",  "record",
                                       "recorded",     "answer"};
    size_t n = sizeof(want) / sizeof(want[0]);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(intake_step_name(i), want[i]);
    assert_null(intake_step_name(n));
}

struct gate_case {
    int status, proven, want;
};

static const struct gate_case gate_cases[] = {
    {400, 0, 1}, /* bad key, bad JSON: the caller must be a tenant to learn it */
    {404, 0, 1}, /* unknown route */
    {422, 0, 1}, /* client reference cannot be placed */
    {400, 1, 0}, /* already proven (store or tenant cache) */
    {422, 1, 0}, /* key reused, after the store answered */
    {401, 0, 0}, /* the authentication's own answer */
    {413, 0, 0}, /* refused without a database round trip */
    {500, 0, 0}, /* the gateway's own failures */
    {503, 0, 0}, {202, 0, 0},
};

static void test_gate(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(gate_cases) / sizeof(gate_cases[0]); i++) {
        const struct gate_case *c = &gate_cases[i];
        print_message("%d proven=%d\n", c->status, c->proven);
        assert_int_equal(intake_needs_tenant(c->status, c->proven), c->want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_order),
        cmocka_unit_test(test_gate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
