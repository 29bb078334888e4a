/* store_finish_order (lease.h): a batch of results is written by tenant, then job id — the order
 * an intake batch locks its tenants' budget rows in — whatever order the calls ended in. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "idemgate/lease.h"

static void test_results_are_written_by_tenant_then_id(void **state)
{
    (void)state;
    static const struct {
        long long tenant;
        const char *id;
    } in[] = {{7, "job_c"}, {3, "job_z"}, {7, "job_a"}, {3, "job_b"}, {12, "job_a"}, {3, "job_b"}};
    /* Wanted: the indexes of in[] in write order (equal keys keep their order). */
    static const size_t want[] = {3, 5, 1, 2, 0, 4};
    enum { N = sizeof(in) / sizeof(in[0]) };
    struct store_finish f[N];
    const struct store_finish *fs[N];
    size_t ord[N];
    for (size_t i = 0; i < N; i++) {
        f[i] = (struct store_finish){.tenant_id = in[i].tenant, .id = in[i].id};
        fs[i] = &f[i];
    }
    store_finish_order(fs, N, ord);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(ord[i], want[i]);
    store_finish_order(fs, 1, ord);
    assert_int_equal(ord[0], 0);
    store_finish_order(fs, 0, ord); /* nothing to order: nothing written */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_results_are_written_by_tenant_then_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
