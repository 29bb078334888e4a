/* Group commit across writer threads: who takes a queue now (gcommit.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "idemgate/gcommit.h"

static void test_one_writer_takes_the_rest_wait_for_its_next_commit(void **state)
{
    (void)state;
    static const struct {
        int writing;
        size_t queued, batch;
        double age_ms;
        int take;
    } rows[] = {
        {0, 0, 64, 0, 0},                  /* nothing waits */
        {0, 1, 64, 0, 1},                  /* nobody writes: the first writer takes it */
        {1, 1, 64, 0, 0},                  /* one writes: its next batch */
        {1, 63, 64, 0, 0},                 /* still less than a batch */
        {1, 64, 64, 0, 1},                 /* a whole batch waits: a second writer helps */
        {2, 200, 64, 0, 1},                /* and a third */
        {1, 1, 64, GC_STALL_MS - 0.5, 0},  /* a writer busy a while */
        {1, 1, 64, GC_STALL_MS, 1},        /* held up: another takes the oldest */
        {3, 0, 64, GC_STALL_MS * 10, 0},   /* an empty queue has nothing to take */
        {-1, 2, 64, 0, 1},                 /* a count gone below zero counts as nobody */
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        int got = gc_take(rows[i].writing, rows[i].queued, rows[i].batch, rows[i].age_ms);
        if (got != rows[i].take)
            fail_msg("row %zu: got %d", i, got);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_writer_takes_the_rest_wait_for_its_next_commit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
