/* Reconciliation verdicts, as a table: what a list or a lookup proves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "idemgate/reconciler.h"

static void test_list_verdicts(void **state)
{
    (void)state;
    static const struct {
        int matches, closed;
        enum recon_verdict want;
    } rows[] = {
        {1, 0, RV_FOUND},  {1, 1, RV_FOUND},   {2, 0, RV_REVIEW},  {5, 1, RV_REVIEW},
        {0, 0, RV_LATER},  {0, 1, RV_ABSENT},  {-1, 0, RV_LATER},  {-1, 1, RV_REVIEW},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        assert_int_equal(recon_list_verdict(rows[i].matches, rows[i].closed), rows[i].want);
}

static void test_lookup_verdicts(void **state)
{
    (void)state;
    static const struct {
        int status, closed;
        enum recon_verdict want;
    } rows[] = {
        {200, 0, RV_FOUND}, {200, 1, RV_FOUND}, {404, 0, RV_ABSENT}, {404, 1, RV_ABSENT},
        {503, 0, RV_LATER}, {503, 1, RV_REVIEW}, {0, 0, RV_LATER},   {0, 1, RV_REVIEW},
        {401, 0, RV_LATER}, {410, 1, RV_REVIEW},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        assert_int_equal(recon_lookup_verdict(rows[i].status, rows[i].closed), rows[i].want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_verdicts),
        cmocka_unit_test(test_lookup_verdicts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
