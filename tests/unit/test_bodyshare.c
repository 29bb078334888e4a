/* Each tenant's bytes of the request bodies held (bodyshare.c): the share refused past its bound,
 * a slot given back when its tenant holds none, and tenants whose ids share a home slot kept
 * apart through every order of coming and going (the backward-shift deletion of an
 * open-addressing table: a lookup must still find each one after any other left). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "idemgate/bodyshare.h"

/* A tenant's bytes up to its share; the next byte refused and nothing added; given back to none,
 * its slot is free again. */
static void test_share(void **state)
{
    (void)state;
    assert_int_equal(bodyshare_add(7, 600, 1000), 1);
    assert_int_equal(bodyshare_add(7, 400, 1000), 1);
    assert_int_equal(bodyshare_add(7, 1, 1000), 0);
    assert_int_equal(bodyshare_of(7), 1000);
    assert_int_equal(bodyshare_add(8, 1000, 1000), 1); /* another tenant's own share */
    assert_int_equal(bodyshare_add(7, -1000, 0), 1);
    assert_int_equal(bodyshare_of(7), 0);
    assert_int_equal(bodyshare_add(8, 5000, 0), 1); /* no share: no bound */
    assert_int_equal(bodyshare_add(8, -6000, 0), 1);
    assert_int_equal(bodyshare_tenants(), 0);
}

/* Ids that share home slots (and the slots after them, wrapping past the table's end), added and
 * removed in many orders: each tenant's bytes always read back as added. */
static void test_collisions(void **state)
{
    (void)state;
    enum { N = 12 };
    long long ids[N];
    size_t n = 0;
    /* six ids whose home is the last slot (their chain wraps to slot 0), six whose home is 0 */
    for (long long id = 1; n < N && id < 2000000000; id++) {
        size_t h = bodyshare_home(id);
        if ((h == BODYSHARE_SLOTS - 1 && n < 6) || (h == 0 && n >= 6))
            ids[n++] = id;
    }
    assert_int_equal(n, N);
    srand(1);
    for (int round = 0; round < 200; round++) {
        long held[N] = {0};
        for (int step = 0; step < 60; step++) {
            int k = rand() % N;
            if (held[k] && rand() % 2) {
                assert_int_equal(bodyshare_add(ids[k], -held[k], 0), 1);
                held[k] = 0;
            } else {
                long more = 1 + rand() % 100;
                assert_int_equal(bodyshare_add(ids[k], more, 0), 1);
                held[k] += more;
            }
            for (int j = 0; j < N; j++)
                if (bodyshare_of(ids[j]) != held[j])
                    fail_msg("round %d step %d: id %lld holds %ld, want %ld", round, step, ids[j],
                             bodyshare_of(ids[j]), held[j]);
        }
        for (int j = 0; j < N; j++)
            if (held[j])
                assert_int_equal(bodyshare_add(ids[j], -held[j], 0), 1);
        assert_int_equal(bodyshare_tenants(), 0);
    }
}

/* Every slot taken: the next tenant is refused, and let in once one leaves. */
static void test_full(void **state)
{
    (void)state;
    for (long long id = 1; id <= BODYSHARE_SLOTS; id++)
        assert_int_equal(bodyshare_add(id, 1, 0), 1);
    assert_int_equal(bodyshare_tenants(), BODYSHARE_SLOTS);
    assert_int_equal(bodyshare_add(BODYSHARE_SLOTS + 1, 1, 0), 0);
    assert_int_equal(bodyshare_add(5, 1, 0), 1); /* one that holds some still may */
    assert_int_equal(bodyshare_add(3, -1, 0), 1);
    assert_int_equal(bodyshare_add(BODYSHARE_SLOTS + 1, 1, 0), 1);
    for (long long id = 1; id <= BODYSHARE_SLOTS + 1; id++)
        if (id != 3)
            assert_int_equal(bodyshare_add(id, -bodyshare_of(id), 0), 1);
    assert_int_equal(bodyshare_tenants(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_share),
        cmocka_unit_test(test_collisions),
        cmocka_unit_test(test_full),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
