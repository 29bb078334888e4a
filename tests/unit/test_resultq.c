/* The result queue's wake-up: a consumer that drains its fd before taking never misses an item,
 * and pushes while a wake-up is pending write nothing more. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "idemgate/resultq.h"

/* The eventfd's counter, read (and so cleared) behind the queue's back: how many writes made
 * it, 0 when none. */
static uint64_t writes_pending(struct rq *q)
{
    uint64_t v = 0;
    if (read(rq_fd(q), &v, sizeof(v)) != (ssize_t)sizeof(v))
        return 0;
    return v;
}

static int readable(struct rq *q)
{
    struct pollfd p = {.fd = rq_fd(q), .events = POLLIN};
    return poll(&p, 1, 0) == 1;
}

static void test_pushes_while_a_wakeup_is_pending_write_once(void **state)
{
    (void)state;
    struct rq *q = rq_new();
    assert_non_null(q);
    struct rq_item it[5] = {{0}};
    for (int i = 0; i < 5; i++)
        rq_push(q, &it[i]);
    rq_kick(q);
    assert_int_equal(writes_pending(q), 1);
    int n = 0;
    assert_ptr_equal(rq_take(q, 10, &n), &it[0]);
    assert_int_equal(n, 5);
    rq_drain_fd(q);
    rq_free(q);
}

static void test_a_push_after_the_drain_always_wakes(void **state)
{
    (void)state;
    struct rq *q = rq_new();
    assert_non_null(q);
    struct rq_item a = {0}, b = {0}, c = {0};
    rq_push(q, &a);
    assert_true(readable(q));
    /* The consumer: drain, then take. */
    rq_drain_fd(q);
    assert_false(readable(q));
    int n = 0;
    assert_ptr_equal(rq_take(q, 10, &n), &a);
    /* A push after the drain (the queue empty again) makes the fd readable. */
    rq_push(q, &b);
    assert_true(readable(q));
    /* A push between the drain and the take: the take sees it, and the next push still
     * wakes. */
    rq_drain_fd(q);
    rq_push(q, &c);
    assert_ptr_equal(rq_take(q, 10, &n), &b);
    assert_int_equal(n, 2);
    assert_true(readable(q)); /* c's push wrote: harmless, the consumer finds nothing */
    rq_drain_fd(q);
    assert_null(rq_take(q, 10, &n));
    rq_kick(q);
    assert_true(readable(q));
    rq_drain_fd(q);
    rq_free(q);
}

static void test_items_left_by_a_take_keep_the_fd_readable(void **state)
{
    (void)state;
    struct rq *q = rq_new();
    assert_non_null(q);
    struct rq_item it[3] = {{0}};
    for (int i = 0; i < 3; i++)
        rq_push(q, &it[i]);
    rq_drain_fd(q);
    int n = 0;
    assert_ptr_equal(rq_take(q, 2, &n), &it[0]);
    assert_int_equal(n, 2);
    assert_true(readable(q));
    rq_drain_fd(q);
    assert_ptr_equal(rq_take(q, 2, &n), &it[2]);
    assert_int_equal(n, 1);
    assert_false(readable(q));
    rq_free(q);
}

/* Producers push while consumers wait on the fd, drain and take, as the pool threads do. A lost
 * wake-up leaves a consumer asleep with items waiting: it then sees its wait run out (5 s, far
 * beyond any scheduling delay) and the test fails. */
#define STRESS_ITEMS 200000
#define STRESS_CONSUMERS 2

struct stress {
    struct rq *q;
    struct rq_item *items;
    atomic_int taken, pushed, stalls;
};

static void *stress_produce(void *arg)
{
    struct stress *st = arg;
    for (int i = 0; i < STRESS_ITEMS; i++) {
        rq_push(st->q, &st->items[i]);
        atomic_fetch_add(&st->pushed, 1);
        if (i % 64 == 0)
            sched_yield();
    }
    return NULL;
}

static void *stress_consume(void *arg)
{
    struct stress *st = arg;
    while (atomic_load(&st->taken) < STRESS_ITEMS) {
        struct pollfd p = {.fd = rq_fd(st->q), .events = POLLIN};
        if (poll(&p, 1, 5000) == 0 && atomic_load(&st->taken) < atomic_load(&st->pushed)) {
            atomic_fetch_add(&st->stalls, 1);
            break;
        }
        rq_drain_fd(st->q);
        int n = 0;
        while (rq_take(st->q, 7, &n))
            atomic_fetch_add(&st->taken, n);
    }
    rq_kick(st->q); /* the other consumer may be waiting for the end */
    return NULL;
}

static void test_no_wakeup_is_lost_between_threads(void **state)
{
    (void)state;
    struct stress st = {.q = rq_new(), .items = calloc(STRESS_ITEMS, sizeof(struct rq_item))};
    assert_non_null(st.q);
    assert_non_null(st.items);
    pthread_t prod, cons[STRESS_CONSUMERS];
    for (int i = 0; i < STRESS_CONSUMERS; i++)
        assert_int_equal(pthread_create(&cons[i], NULL, stress_consume, &st), 0);
    assert_int_equal(pthread_create(&prod, NULL, stress_produce, &st), 0);
    pthread_join(prod, NULL);
    for (int i = 0; i < STRESS_CONSUMERS; i++)
        pthread_join(cons[i], NULL);
    assert_int_equal(atomic_load(&st.stalls), 0);
    assert_int_equal(atomic_load(&st.taken), STRESS_ITEMS);
    rq_free(st.q);
    free(st.items);
}

static void test_waiting_counts_the_items_and_ages_the_oldest(void **state)
{
    (void)state;
    struct rq *q = rq_new();
    assert_non_null(q);
    double age = -1;
    assert_int_equal(rq_waiting(q, &age), 0);
    assert_true(age == 0);
    struct rq_item it[3] = {{0}};
    for (int i = 0; i < 3; i++)
        rq_push(q, &it[i]);
    usleep(2000);
    assert_int_equal(rq_waiting(q, &age), 3);
    assert_true(age >= 1.0);
    int n = 0;
    assert_ptr_equal(rq_take(q, 2, &n), &it[0]);
    assert_int_equal(rq_waiting(q, &age), 1);
    assert_ptr_equal(rq_take(q, 2, &n), &it[2]);
    assert_int_equal(rq_waiting(q, &age), 0);
    assert_true(age == 0);
    rq_drain_fd(q);
    rq_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pushes_while_a_wakeup_is_pending_write_once),
        cmocka_unit_test(test_a_push_after_the_drain_always_wakes),
        cmocka_unit_test(test_items_left_by_a_take_keep_the_fd_readable),
        cmocka_unit_test(test_no_wakeup_is_lost_between_threads),
        cmocka_unit_test(test_waiting_counts_the_items_and_ages_the_oldest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
