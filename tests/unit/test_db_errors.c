/* Which SQLSTATEs are a retryable 503 (the statement did nothing) and which are a 500. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "idemgate/db.h"

static void test_retryable_sqlstates(void **state)
{
    (void)state;
    static const struct {
        const char *sqlstate;
        int retryable;
    } cases[] = {
        {"40001", 1}, /* serialization_failure */
        {"40P01", 1}, /* deadlock_detected */
        {"55P03", 1}, /* lock_not_available: lock_timeout */
        {"57014", 1}, /* query_canceled: statement_timeout */
        {"23505", 0}, /* unique_violation: decided by the caller */
        {"23503", 0}, /* foreign_key_violation */
        {"42P01", 0}, /* undefined_table: a schema problem, not a retry */
        {"57P01", 0}, /* admin_shutdown: the connection is gone (handled as unavailable) */
        {"5", 0},
        {"", 0},
        {NULL, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(db_sqlstate_retryable(cases[i].sqlstate), cases[i].retryable);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_retryable_sqlstates)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
