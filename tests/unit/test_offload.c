/* The database workers' queue: upkeep first, then one item of each caller in turn. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <pthread.h>

#include "idemgate/offload.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int released, started;
static char order[64];
static size_t n_order;

static void block(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    started = 1;
    pthread_cond_broadcast(&cv);
    while (!released)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void note(void *arg)
{
    pthread_mutex_lock(&mu);
    order[n_order++] = *(const char *)arg;
    pthread_mutex_unlock(&mu);
}

static int ran_count;

/* Notes when it ran: 1, 2, 3 … (the pool has one thread). */
static void note_ran(void *arg)
{
    *(int *)arg = ++ran_count;
}

/* Holds the pool's one thread (its blocker queued as caller a), queues tags' items — 'a' as a,
 * 'b' as b, 'U' as upkeep — lets go, and leaves the order they ran in. */
static void run_queued(const char *a, const char *b, const char *tags)
{
    released = started = 0;
    n_order = 0;
    struct offload *o = offload_start(1);
    assert_non_null(o);
    struct offload_item blocker = {.fn = block};
    assert_int_equal(offload_submit_as(o, &blocker, a, strlen(a)), 0);
    pthread_mutex_lock(&mu);
    while (!started)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    struct offload_item items[16];
    size_t n = strlen(tags);
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++) {
        items[i] = (struct offload_item){.fn = note, .arg = (void *)&tags[i]};
        const char *key = tags[i] == 'a' ? a : b;
        if (tags[i] == 'U')
            assert_int_equal(offload_submit(o, &items[i]), 0);
        else
            assert_int_equal(offload_submit_as(o, &items[i], key, strlen(key)), 0);
    }
    pthread_mutex_lock(&mu);
    released = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    offload_free(o); /* runs every queued item */
    order[n_order] = '\0';
}

static void test_lanes_are_served_in_turn(void **state)
{
    (void)state;
    const char *a = "Bearer igt_tenant_a", *b = "Bearer igt_tenant_b";
    assert_int_not_equal(offload_lane(a, strlen(a)), offload_lane(b, strlen(b)));
    /* While the one thread is held: tenant a queues six, then b one, then an upkeep item.
     * Upkeep first; b's one item after at most one of a's (the turn after a's blocker). */
    run_queued(a, b, "aaaaaabU");
    assert_string_equal(order, "Ubaaaaaa");
}

static void test_callers_whose_keys_hash_alike_are_served_in_turn(void **state)
{
    (void)state;
    /* Two tenants whose keys hash to one home lane (with 64 lanes, most sets of a dozen tenants
     * hold such a pair): each still gets a lane of its own while it has items waiting. Before,
     * b's one read waited behind all six of a's. */
    char a[32], b[32];
    snprintf(a, sizeof(a), "tenant %d", 1);
    int home = offload_lane(a, strlen(a)), id = 2;
    for (;; id++) {
        snprintf(b, sizeof(b), "tenant %d", id);
        if (offload_lane(b, strlen(b)) == home)
            break;
    }
    run_queued(a, b, "aaaaaab");
    assert_string_equal(order, "baaaaaa");
    /* An unauthenticated caller (a webhook path no provider has, the probes) likewise. */
    for (id = 0;; id++) {
        snprintf(b, sizeof(b), "probe %d", id);
        if (offload_lane(b, strlen(b)) == home)
            break;
    }
    run_queued(a, b, "aaaaaab");
    assert_string_equal(order, "baaaaaa");
}

static void test_more_callers_than_lanes_all_run(void **state)
{
    (void)state;
    /* Three times as many callers waiting as there are lanes: every item runs once (they then
     * share lanes), each caller's in the order it queued them. */
    enum { CALLERS = 3 * OFFLOAD_LANES, EACH = 3 };
    static struct offload_item items[CALLERS * EACH];
    static int ran[CALLERS * EACH];
    struct offload *o = offload_start(1);
    assert_non_null(o);
    released = started = 0;
    struct offload_item blocker = {.fn = block};
    assert_int_equal(offload_submit(o, &blocker), 0);
    pthread_mutex_lock(&mu);
    while (!started)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    char key[32];
    for (int i = 0; i < CALLERS * EACH; i++) {
        items[i] = (struct offload_item){.fn = note_ran, .arg = &ran[i]};
        int n = snprintf(key, sizeof(key), "tenant %d", i % CALLERS);
        assert_int_equal(offload_submit_as(o, &items[i], key, (size_t)n), 0);
    }
    pthread_mutex_lock(&mu);
    released = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    offload_free(o);
    for (int i = 0; i < CALLERS * EACH; i++)
        assert_true(ran[i] > 0);
    /* A caller's own items in order: its i-th ran before its (i+1)-th. */
    for (int c = 0; c < CALLERS; c++)
        for (int k = 0; k + 1 < EACH; k++)
            assert_true(ran[c + k * CALLERS] < ran[c + (k + 1) * CALLERS]);
}

static void test_lanes_are_spread(void **state)
{
    (void)state;
    int hit[OFFLOAD_LANES] = {0};
    char key[32];
    for (int i = 0; i < 4096; i++) {
        int n = snprintf(key, sizeof(key), "Bearer igt_%d", i);
        int lane = offload_lane(key, (size_t)n);
        assert_true(lane >= 0 && lane < OFFLOAD_LANES);
        hit[lane]++;
    }
    /* Every lane but the untrusted callers' own is reached; no key but theirs lands in it. */
    assert_int_equal(hit[0], 0);
    for (int l = 1; l < OFFLOAD_LANES; l++)
        assert_true(hit[l] > 0);
    assert_int_equal(offload_lane(OFFLOAD_UNTRUSTED_KEY, strlen(OFFLOAD_UNTRUSTED_KEY)), 0);
    for (int id = 1; id <= 100000; id++) {
        int n = snprintf(key, sizeof(key), "tenant %d", id);
        assert_int_not_equal(offload_lane(key, (size_t)n), 0);
    }
    assert_int_not_equal(offload_lane("unknown ", 8), 0);
    assert_int_equal(offload_lane(NULL, 0), offload_lane("", 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lanes_are_served_in_turn),
        cmocka_unit_test(test_lanes_are_spread),
        cmocka_unit_test(test_callers_whose_keys_hash_alike_are_served_in_turn),
        cmocka_unit_test(test_more_callers_than_lanes_all_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
