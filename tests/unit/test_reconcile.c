/* Reconciliation decisions, as tables: what a search proves, what the reconciler does with an
 * unknown operation, and where a found task leads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "idemgate/jpath.h"
#include "idemgate/profile.h"
#include "idemgate/reconciler.h"

#include <string.h>

static void test_list_verdicts(void **state)
{
    (void)state;
    static const struct {
        int matches, closed, grace;
        enum recon_verdict want;
    } rows[] = {
        {1, 0, 0, RV_FOUND},   {1, 1, 1, RV_FOUND},   {2, 0, 1, RV_REVIEW}, {5, 1, 1, RV_REVIEW},
        /* None found: absent only once the grace after the last ambiguous send has passed
         * (a task may be committed after our timeout), and resent only inside the window. */
        {0, 0, 0, RV_LATER},   {0, 0, 1, RV_ABSENT},  {0, 1, 0, RV_LATER},  {0, 1, 1, RV_REVIEW},
        /* A page that failed (or a page limit) proves nothing. */
        {-1, 0, 0, RV_LATER},  {-1, 0, 1, RV_LATER},  {-1, 1, 1, RV_REVIEW},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (recon_list_verdict(rows[i].matches, rows[i].closed, rows[i].grace) != rows[i].want)
            fail_msg("row %zu", i);
}

/* Absence is proven only under the reference placement and search the create was recorded
 * under (the digest after '#'); the profile's id alone does not matter. */
static void test_same_reference(void **state)
{
    (void)state;
    static const struct {
        const char *recorded, *current;
        int want;
    } rows[] = {
        {"openai-images#a1b2c3d4e5f6", "openai-images#a1b2c3d4e5f6", 1},
        {"openai-images#a1b2c3d4e5f6", "openai-images#0f0f0f0f0f0f", 0},
        {"images-v1#a1b2c3d4e5f6", "images-v2#a1b2c3d4e5f6", 1}, /* renamed, same placement */
        {"openai-images#a1b2c3d4e5f6", "openai-images", 0},       /* never a stamp now */
        {"openai-images#a1b2c3d4e5f6", NULL, 0},
        {"openai-images", "openai-images#a1b2c3d4e5f6", 1}, /* recorded before stamps */
        {NULL, "openai-images#a1b2c3d4e5f6", 1},
        {"x#", "x#", 1},
        {"x#a", "x#ab", 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (recon_same_reference(rows[i].recorded, rows[i].current) != rows[i].want)
            fail_msg("row %zu", i);
}

static void test_next_page(void **state)
{
    (void)state;
    static const struct {
        int total, cursor, read, max, past_lease;
        enum recon_page_step want;
    } rows[] = {
        /* The last page (no cursor): what was counted is proven, whatever is left. */
        {0, 0, 1, 50, 0, RPS_DONE},       {2, 0, 3, 50, 1, RPS_DONE},
        {1, 0, 50, 50, 0, RPS_DONE},
        /* A cursor: the next page, while pages and the lease allow. */
        {0, 1, 1, 50, 0, RPS_NEXT},       {1, 1, 49, 50, 0, RPS_NEXT},
        {0, 1, 50, 50, 0, RPS_UNPROVEN},  {0, 1, 1, 1, 0, RPS_UNPROVEN},
        {0, 1, 1, 50, 1, RPS_UNPROVEN},   {3, 1, 2, 50, 1, RPS_UNPROVEN},
        /* A page that failed proves nothing, cursor or not. */
        {-1, 0, 1, 50, 0, RPS_UNPROVEN},  {-1, 1, 1, 50, 0, RPS_UNPROVEN},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (recon_next_page(rows[i].total, rows[i].cursor, rows[i].read, rows[i].max,
                            rows[i].past_lease) != rows[i].want)
            fail_msg("row %zu", i);
}

/* What a whole search proves: no match among items none of which shows the match path proves
 * nothing (a list view without the member: every ambiguous create would have been sent again). */
static void test_search_proof(void **state)
{
    (void)state;
    static const struct {
        int total, items, readable, want;
    } rows[] = {
        {0, 0, 0, 0},   /* an empty list in the window: absence (after the grace) */
        {0, 5, 5, 0},   /* five tasks, all readable, none ours: absence */
        {0, 5, 1, 0},   /* others' tasks without the member beside one that has it */
        {0, 5, 0, -1},  /* nobody's reference readable: nothing proven */
        {1, 5, 1, 1},   /* found */
        {2, 5, 2, 2},   /* several: review, as ever */
        {-1, 5, 5, -1}, /* a page failed */
        {-1, 0, 0, -1},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (recon_search_proof(rows[i].total, rows[i].items, rows[i].readable) != rows[i].want)
            fail_msg("row %zu", i);
}

static void test_later(void **state)
{
    (void)state;
    static const struct {
        long interval, grace;
        long long since;
        long want;
    } rows[] = {
        {250, 5000, 0, 5000},   {250, 5000, 1000, 4000}, {250, 5000, 4900, 250},
        {250, 5000, 5000, 250}, {250, 5000, 60000, 250}, {1000, 0, 0, 1000},
        {2000, 1500, 0, 2000},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (recon_later_ms(rows[i].interval, rows[i].grace, rows[i].since) != rows[i].want)
            fail_msg("row %zu", i);
}

static void test_lookup_verdicts(void **state)
{
    (void)state;
    static const struct {
        int proves, closed, grace;
        enum recon_verdict want;
    } rows[] = {
        {1, 0, 0, RV_FOUND},    {1, 1, 1, RV_FOUND},   {0, 0, 0, RV_LATER},
        {0, 0, 1, RV_ABSENT},   {0, 1, 1, RV_REVIEW},  {-1, 0, 1, RV_LATER},
        {-1, 1, 1, RV_REVIEW},  {-1, 0, 0, RV_LATER},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (recon_lookup_verdict(rows[i].proves, rows[i].closed, rows[i].grace) != rows[i].want)
            fail_msg("row %zu", i);
}

/* What a lookup's answer proves is read in its body: our reference in a 2xx, the provider's own
 * "no such task" in a 404 — a status alone proves nothing. */
static void test_lookup_proves(void **state)
{
    (void)state;
    struct cfg_provider p = {0};
    const char *why = NULL;
    assert_int_equal(jpath_compile("$.client_ref", &p.lookup_client_ref, &why), 0);
    assert_int_equal(jpath_compile("$.error.code", &p.lookup_absent, &why), 0);
    p.lookup_absent_equals = "not_found";
    static const struct {
        int status;
        const char *body;
        int want;
    } rows[] = {
        {200, "{\"id\": \"t1\", \"client_ref\": \"job_1\"}", 1},
        {201, "{\"client_ref\": \"job_1\"}", 1},
        /* another task (a filter the provider ignored), or ours unreadable */
        {200, "{\"id\": \"t2\", \"client_ref\": \"job_2\"}", -1},
        {200, "{\"id\": \"t1\"}", -1},
        {200, "{\"client_ref\": 7}", -1},
        {200, "[]", -1},
        {200, "not json", -1},
        {200, "", -1},
        {404, "{\"error\": {\"code\": \"not_found\"}}", 0},
        /* a renamed route, a proxy's page, another error */
        {404, "{\"error\": {\"code\": \"no_such_endpoint\"}}", -1},
        {404, "<html><body>404 Not Found</body></html>", -1},
        {404, "", -1},
        {404, "{\"client_ref\": \"job_1\"}", -1},
        {410, "{\"error\": {\"code\": \"not_found\"}}", -1},
        {500, "{\"error\": {\"code\": \"not_found\"}}", -1},
        {0, NULL, -1},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const char *b = rows[i].body;
        int got = recon_lookup_proves(&p, rows[i].status, b, b ? strlen(b) : 0, "job_1");
        if (got != rows[i].want)
            fail_msg("row %zu: %d, want %d", i, got, rows[i].want);
    }
    jpath_free(p.lookup_client_ref);
    jpath_free(p.lookup_absent);
}

static void test_plans(void **state)
{
    (void)state;
#define R RECON_IDEMPOTENT_RESUBMIT
#define L RECON_GET_BY_CLIENT_ID
#define M RECON_LIST_MATCH
#define N RECON_NONE
    static const struct {
        struct recon_facts f; /* strategy, can_look, cancel, closed, budget, hint */
        enum recon_plan want;
    } rows[] = {
        {{R, 0, 0, 0, 1, 0}, RP_RESEND},
        {{R, 0, 0, 0, 0, 0}, RP_REVIEW}, /* budget spent */
        {{R, 0, 0, 1, 1, 0}, RP_REVIEW}, /* the provider may have forgotten the key */
        /* A cancelled operation is never sent again, not even under its key. */
        {{R, 0, 1, 0, 1, 0}, RP_WAIT},
        {{R, 0, 1, 1, 1, 0}, RP_REVIEW},
        {{L, 1, 0, 0, 1, 0}, RP_LOOK},   {{L, 1, 1, 0, 1, 0}, RP_LOOK},
        {{M, 1, 1, 1, 0, 0}, RP_LOOK},   {{M, 0, 0, 0, 1, 0}, RP_WAIT},
        {{M, 0, 0, 1, 1, 0}, RP_REVIEW},
        {{N, 0, 0, 0, 1, 0}, RP_WAIT},   {{N, 0, 0, 1, 1, 0}, RP_REVIEW},
        {{N, 0, 1, 0, 1, 0}, RP_WAIT},
        /* A verified webhook named the task: read and adopt it, whatever the strategy. */
        {{N, 0, 0, 1, 1, 1}, RP_ADOPT},  {{R, 0, 1, 0, 1, 1}, RP_ADOPT},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (recon_plan(&rows[i].f) != rows[i].want)
            fail_msg("row %zu: got %d", i, recon_plan(&rows[i].f));
#undef R
#undef L
#undef M
#undef N
}

static void test_found_states(void **state)
{
    (void)state;
    static const struct {
        int async, has_id, result_read;
        enum op_state want;
    } rows[] = {
        {0, 0, 1, ST_COMPLETED}, /* a sync task's answer is its result */
        {0, 1, 1, ST_COMPLETED},
        {0, 1, 0, ST_REVIEW},    /* the result is not where the profile says: never completed */
        {0, 0, 0, ST_REVIEW},
        {1, 1, 1, ST_ACCEPTED},  /* polled to its end (cancelled there first, when asked) */
        {1, 1, 0, ST_ACCEPTED},
        {1, 0, 1, ST_REVIEW},    /* never completed while queued */
        {1, 0, 0, ST_REVIEW},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        enum op_state got = recon_found_state(rows[i].async, rows[i].has_id, rows[i].result_read);
        assert_int_equal(got, rows[i].want);
        /* A found task is never failed: a task exists (invariant 8). */
        assert_int_not_equal(got, ST_FAILED);
    }
}

/* A task named by its id and not adopted: what is written (reconciler.c, write_adopt). */
static void test_adopt_misses(void **state)
{
    (void)state;
    static const struct {
        int operator_found, has_hint, answered, readable_by_id, strategy_none, window_closed;
        enum recon_adopt_miss want;
    } rows[] = {
        {1, 0, 0, 1, 0, 0, RAM_NAMED_UNREADABLE},
        {1, 1, 1, 1, 1, 1, RAM_NAMED_UNREADABLE},
        {0, 0, 0, 1, 0, 0, RAM_STREAM_ID_UNREAD},
        {0, 0, 1, 1, 1, 1, RAM_STREAM_ID_UNREAD},
        {0, 1, 1, 1, 0, 0, RAM_NOT_OURS},
        {0, 1, 1, 1, 1, 0, RAM_NOT_OURS},
        {0, 1, 1, 1, 0, 1, RAM_NOT_OURS},
        /* Signed, not readable by id: a strategy that can look searches, its grace from now —
         * while the window is open; closed, nothing searches: the hint kept, review. */
        {0, 1, 0, 0, 0, 0, RAM_SEARCH_FROM_NOW},
        {0, 1, 0, 0, 0, 1, RAM_HINT_REVIEW},
        {0, 1, 0, 0, 1, 0, RAM_HINT_REVIEW},
        {0, 1, 0, 0, 1, 1, RAM_HINT_REVIEW},
        {0, 1, 0, 1, 0, 0, RAM_HINT_KEPT},
        {0, 1, 0, 1, 1, 0, RAM_HINT_KEPT},
        {0, 1, 0, 1, 0, 1, RAM_HINT_KEPT},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        enum recon_adopt_miss got =
            recon_adopt_miss(rows[i].operator_found, rows[i].has_hint, rows[i].answered,
                             rows[i].readable_by_id, rows[i].strategy_none, rows[i].window_closed);
        if (got != rows[i].want)
            fail_msg("row %zu: %d, want %d", i, (int)got, (int)rows[i].want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_verdicts),
        cmocka_unit_test(test_lookup_verdicts),
        cmocka_unit_test(test_lookup_proves),
        cmocka_unit_test(test_next_page),
        cmocka_unit_test(test_same_reference),
        cmocka_unit_test(test_later),
        cmocka_unit_test(test_search_proof),
        cmocka_unit_test(test_plans),
        cmocka_unit_test(test_found_states),
        cmocka_unit_test(test_adopt_misses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
