/* How an answer's buffer grows (upstream.h, up_grow_cap): doubled, never past the answer's cap.
 * Table-driven. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "idemgate/upstream.h"

#define MIB ((size_t)1 << 20)

static void test_grows_by_doubling_up_to_the_cap(void **state)
{
    (void)state;
    static const struct {
        size_t cap, need, limit, want;
    } rows[] = {
        {0, 1, 1024 * MIB, UP_RECV_BUFFER},             /* the first piece */
        {0, UP_RECV_BUFFER + 1, 1024 * MIB, 2 * UP_RECV_BUFFER},
        {8 * MIB, 8 * MIB + 1, 1024 * MIB, 16 * MIB},   /* doubled */
        {8 * MIB, 40 * MIB, 1024 * MIB, 64 * MIB},
        /* a 16 MiB cap (+ its NUL): 17 MiB of answer holds 16 MiB + 1, never 32 MiB */
        {16 * MIB, 16 * MIB + 1, 16 * MIB + 1, 16 * MIB + 1},
        {12 * MIB, 16 * MIB, 16 * MIB + 1, 16 * MIB + 1},
        {4 * MIB, 6 * MIB, 16 * MIB + 1, 8 * MIB},      /* under half the cap: doubled */
        {0, 100, 1025, 1025},                           /* a cap under the first piece */
        {1025, 1025, 1025, 1025},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        size_t got = up_grow_cap(rows[i].cap, rows[i].need, rows[i].limit);
        if (got != rows[i].want)
            fail_msg("row %zu: %zu, want %zu", i, got, rows[i].want);
        assert_true(got >= rows[i].need && got <= rows[i].limit);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grows_by_doubling_up_to_the_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
