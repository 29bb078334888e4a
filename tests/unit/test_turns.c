/* Claims in turn (turns.h): the ring of tenants with due work, and turns_claim over a world of
 * queues held here (no database: the read and the claim are the test's). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "idemgate/turns.h"
#include "idemgate/wake.h"

#define N_ROWS(a) (sizeof(a) / sizeof((a)[0]))

struct ring_case {
    const char *what;
    long long set[6];
    size_t n;
    long long last;    /* served last before the set */
    long long want[6]; /* the next four turns (0: none) */
};

static const struct ring_case ring_cases[] = {
    {"sorted and deduplicated", {5, 3, 5, 1}, 4, 0, {1, 3, 5, 1}},
    {"goes on after the one served last", {1, 2, 4, 5}, 4, 3, {4, 5, 1, 2}},
    {"the one served last is still first in line after the others", {7, 9}, 2, 9, {7, 9, 7, 9}},
    {"one tenant has every turn", {42}, 1, 42, {42, 42, 42, 42}},
    {"empty: no turn", {0}, 0, 5, {0, 0, 0, 0}},
    {"the one served last is past every id: wraps", {2, 3}, 2, 100, {2, 3, 2, 3}},
};

static void ring_turns(void **state)
{
    (void)state;
    for (size_t c = 0; c < N_ROWS(ring_cases); c++) {
        const struct ring_case *k = &ring_cases[c];
        struct turn_ring r = {.last = k->last};
        assert_int_equal(turn_ring_set(&r, k->set, k->n), 0);
        for (int i = 0; i < 4; i++) {
            long long t = 0;
            int some = turn_ring_next(&r, &t);
            if (!k->want[i]) {
                assert_int_equal(some, 0);
                continue;
            }
            if (!some || t != k->want[i])
                fail_msg("%s: turn %d: got %lld, want %lld", k->what, i, some ? t : 0, k->want[i]);
        }
        turn_ring_fini(&r);
    }
}

static void ring_drop(void **state)
{
    (void)state;
    struct turn_ring r = {0};
    long long ids[] = {4, 8, 15, 16}, t;
    assert_int_equal(turn_ring_set(&r, ids, 4), 0);
    turn_ring_drop(&r, 8);
    turn_ring_drop(&r, 99); /* absent: nothing */
    assert_int_equal(r.n, 3);
    assert_true(turn_ring_next(&r, &t) && t == 4);
    assert_true(turn_ring_next(&r, &t) && t == 15);
    turn_ring_drop(&r, 16);
    turn_ring_drop(&r, 4);
    turn_ring_drop(&r, 15);
    assert_int_equal(turn_ring_next(&r, &t), 0);
    turn_ring_fini(&r);
}

/* A turn given back (its claim not made for want of room) is served again next, unless another
 * turn was taken since (another thread's claim). */
static void ring_keep(void **state)
{
    (void)state;
    struct turn_ring r = {0};
    long long ids[] = {4, 8, 15}, t;
    assert_int_equal(turn_ring_set(&r, ids, 3), 0);
    assert_true(turn_ring_next(&r, &t) && t == 4);
    long long before = r.last;
    assert_true(turn_ring_next(&r, &t) && t == 8);
    turn_ring_keep(&r, 8, before);
    assert_true(turn_ring_next(&r, &t) && t == 8); /* its turn again, not 15's */
    before = r.last;
    assert_true(turn_ring_next(&r, &t) && t == 15);
    assert_true(turn_ring_next(&r, &t) && t == 4); /* another turn taken meanwhile */
    turn_ring_keep(&r, 15, before);                /* too late: nothing */
    assert_true(turn_ring_next(&r, &t) && t == 8);
    turn_ring_fini(&r);
}

/* A world of tenants with queues of due jobs. */
#define TENANTS 4
struct world {
    int queue[TENANTS + 1]; /* due jobs per tenant id 1..TENANTS */
    int reads, claims;
    int fail_read, fail_claim_of;
    int full; /* no room: every claim is refused, its turn kept */
    long long served[512];
    int n_served;
};

static int world_read(struct db *db, void *arg, long long **ids, size_t *n)
{
    (void)db;
    struct world *w = arg;
    w->reads++;
    if (w->fail_read)
        return STORE_EUNAVAIL;
    *ids = malloc(TENANTS * sizeof(**ids));
    *n = 0;
    for (long long t = TENANTS; t >= 1; t--) /* any order */
        if (w->queue[t] > 0)
            (*ids)[(*n)++] = t;
    return STORE_OK;
}

static int world_claim(struct db *db, long long tenant, void *arg)
{
    (void)db;
    struct world *w = arg;
    w->claims++;
    if (tenant == w->fail_claim_of)
        return STORE_ERETRY;
    if (w->full)
        return TURN_KEPT;
    if (w->queue[tenant] <= 0)
        return STORE_ENOTFOUND;
    w->queue[tenant]--;
    w->served[w->n_served++] = tenant;
    return STORE_OK;
}

/* A flood of one tenant, then a quiet tenant's one job: it is served on the next claim after
 * the news of its job, not after the flood. */
static void quiet_tenant_behind_a_flood(void **state)
{
    (void)state;
    struct turns t = TURNS_INIT;
    struct world w = {0};
    w.queue[1] = 100;
    for (int i = 0; i < 10; i++)
        assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK);
    w.queue[3] = 1;
    wake_heard_work(); /* another replica recorded it (or wake_work here) */
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK);
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK);
    int at = -1;
    for (int i = 0; i < w.n_served; i++)
        if (w.served[i] == 3)
            at = i;
    assert_true(at == 10 || at == 11);
    assert_int_equal(w.queue[3], 0);
    turn_ring_fini(&t.ring);
}

/* Busy tenants alternate, one claim each per round; when none has anything: STORE_ENOTFOUND. */
static void tenants_alternate_and_empty_ones_leave(void **state)
{
    (void)state;
    struct turns t = TURNS_INIT;
    struct world w = {0};
    w.queue[1] = 3;
    w.queue[2] = 3;
    w.queue[4] = 1;
    for (int i = 0; i < 7; i++)
        assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK);
    long long want[] = {1, 2, 4, 1, 2, 1, 2};
    assert_int_equal(w.n_served, 7);
    for (int i = 0; i < 7; i++)
        assert_int_equal(w.served[i], want[i]);
    /* The round is over: the ring is read again, finds nothing, and no tenant is tried. */
    int claims = w.claims, reads = w.reads;
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_ENOTFOUND);
    assert_int_equal(w.claims - claims, 0);
    assert_int_equal(w.reads - reads, 1);
    assert_int_equal(t.ring.n, 0);
    /* An empty ring is read again on the next call, which finds new work at once. */
    w.queue[4] = 1;
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK);
    assert_true(w.reads > reads);
    assert_int_equal(w.served[7], 4);
    turn_ring_fini(&t.ring);
}

/* A claim refused for want of room (TURN_KEPT) is a retry for the caller, and the tenant whose
 * turn it was is served first once there is room again — not the one after it. */
static void a_turn_refused_for_room_is_kept(void **state)
{
    (void)state;
    struct turns t = TURNS_INIT;
    struct world w = {0};
    w.queue[1] = 2;
    w.queue[2] = 2;
    w.queue[3] = 2;
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK); /* 1 */
    w.full = 1;
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_ERETRY);
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_ERETRY);
    w.full = 0;
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK);
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK);
    assert_int_equal(w.n_served, 3);
    assert_int_equal(w.served[1], 2); /* its turn, twice refused, kept */
    assert_int_equal(w.served[2], 3);
    turn_ring_fini(&t.ring);
}

/* A tenant whose claim comes back empty while still in the ring (another replica took its row)
 * is dropped, and the next tenant is served in the same call, without a read. */
static void a_stale_tenant_is_skipped_in_the_same_call(void **state)
{
    (void)state;
    struct turns t = TURNS_INIT;
    struct world w = {0};
    w.queue[1] = 2;
    w.queue[2] = 1;
    w.queue[3] = 1;
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK); /* 1 */
    w.queue[2] = 0; /* taken elsewhere */
    int reads = w.reads;
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK);
    assert_int_equal(w.reads, reads);
    assert_int_equal(w.served[1], 3);
    assert_int_equal(t.ring.n, 2); /* 1 and 3 */
    turn_ring_fini(&t.ring);
}

/* A tenant whose first job came while another tenant's backlog is served — no news of it (the
 * signal was lost, or not yet read) — is in the next round: the ring is read when a round ends. */
static void a_new_tenant_is_in_the_next_round_without_news(void **state)
{
    (void)state;
    struct turns t = TURNS_INIT;
    struct world w = {0};
    w.queue[2] = 50;
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK);
    w.queue[1] = 1;
    w.queue[4] = 1;
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK);
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK);
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK);
    long long want[] = {2, 4, 1, 2};
    for (int i = 0; i < 4; i++)
        assert_int_equal(w.served[i], want[i]);
    turn_ring_fini(&t.ring);
}

static void errors_are_returned(void **state)
{
    (void)state;
    struct turns t = TURNS_INIT;
    struct world w = {0};
    w.queue[2] = 1;
    w.fail_read = 1;
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_EUNAVAIL);
    w.fail_read = 0;
    w.fail_claim_of = 2;
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_ERETRY);
    assert_int_equal(w.queue[2], 1); /* nothing was taken */
    w.fail_claim_of = 0;
    assert_int_equal(turns_claim(&t, NULL, world_read, world_claim, &w), STORE_OK);
    assert_int_equal(w.queue[2], 0);
    turn_ring_fini(&t.ring);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ring_turns),
        cmocka_unit_test(ring_drop),
        cmocka_unit_test(ring_keep),
        cmocka_unit_test(a_turn_refused_for_room_is_kept),
        cmocka_unit_test(quiet_tenant_behind_a_flood),
        cmocka_unit_test(tenants_alternate_and_empty_ones_leave),
        cmocka_unit_test(a_stale_tenant_is_skipped_in_the_same_call),
        cmocka_unit_test(a_new_tenant_is_in_the_next_round_without_news),
        cmocka_unit_test(errors_are_returned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
