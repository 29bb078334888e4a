/* Statement health (stmthealth.h): which SQLSTATEs say a statement cannot run, and the set of
 * failing statements /readyz reports. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "idemgate/stmthealth.h"

#define N_ROWS(a) (sizeof(a) / sizeof((a)[0]))

static const struct {
    const char *sqlstate;
    int counts;
} cases[] = {
    {"0A000", 1}, /* feature not supported (Citus: non-IMMUTABLE functions in CASE) */
    {"42P01", 1}, /* undefined table: a schema the binary does not match */
    {"42703", 1}, /* undefined column */
    {"42883", 1}, /* undefined function */
    {"XX000", 1}, /* internal error (Citus: nested distributed execution) */
    {"26000", 0}, /* a statement the server forgot (a transaction pooler): prepared again */
    {"42P05", 0}, /* a statement the server already has (a transaction pooler) */
    {"39P01", 1}, /* trigger protocol violated */
    {"22P02", 0}, /* a value one request sent: never a replica's readiness */
    {"22001", 0}, /* string too long: the same */
    {"23505", 0}, /* unique violation: expected */
    {"40001", 0}, /* serialization failure: retried */
    {"55P03", 0}, /* lock not available */
    {"57014", 0}, /* query canceled */
    {"08006", 0}, /* connection failure: /readyz's `database` says so */
    {"", 0},
    {"0A", 0},
    {NULL, 0},
};

static void which_sqlstates_count(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS(cases); i++)
        if (sh_sqlstate_counts(cases[i].sqlstate) != cases[i].counts)
            fail_msg("%s: want %d", cases[i].sqlstate ? cases[i].sqlstate : "NULL",
                     cases[i].counts);
}

struct seen {
    char names[8][32];
    char states[8][6];
    int n;
};

static void collect(const char *stmt, const char *sqlstate, double age_s, void *arg)
{
    struct seen *s = arg;
    assert_true(age_s >= 0 && age_s < SH_WINDOW_S);
    strcpy(s->names[s->n], stmt);
    strcpy(s->states[s->n++], sqlstate);
}

static void failing_until_the_next_success(void **state)
{
    (void)state;
    static const char claim[] = "claim", finish[] = "finish";
    struct seen s = {0};
    assert_int_equal(sh_failing(collect, &s), 0);
    sh_ok(claim); /* nothing failing: nothing to clear */
    sh_failed(claim, "22P02"); /* a request's bad value: not counted */
    assert_int_equal(sh_failing(NULL, NULL), 0);
    sh_failed(claim, "0A000");
    sh_failed(finish, "XX000");
    sh_failed(claim, "42P01"); /* the same statement again: one entry, the last SQLSTATE */
    assert_int_equal(sh_failing(collect, &s), 2);
    for (int i = 0; i < s.n; i++)
        if (!strcmp(s.names[i], "claim"))
            assert_string_equal(s.states[i], "42P01");
    sh_ok(claim);
    memset(&s, 0, sizeof(s));
    assert_int_equal(sh_failing(collect, &s), 1);
    assert_string_equal(s.names[0], "finish");
    sh_ok(finish);
    assert_int_equal(sh_failing(NULL, NULL), 0);
}

/* More failing statements than SH_MAX: the first SH_MAX are tracked (the replica is not ready
 * either way), a later one is not, and each clears on its own success. */
static void at_most_sh_max_tracked(void **state)
{
    (void)state;
    static char names[SH_MAX + 8][16];
    for (int i = 0; i < SH_MAX + 8; i++) {
        snprintf(names[i], sizeof(names[i]), "stmt_%d", i);
        sh_failed(names[i], "42P01");
    }
    assert_int_equal(sh_failing(NULL, NULL), SH_MAX);
    sh_ok(names[SH_MAX + 1]); /* never tracked: nothing to clear */
    assert_int_equal(sh_failing(NULL, NULL), SH_MAX);
    sh_ok(names[0]);
    assert_int_equal(sh_failing(NULL, NULL), SH_MAX - 1);
    sh_failed(names[SH_MAX + 2], "0A000"); /* room again */
    assert_int_equal(sh_failing(NULL, NULL), SH_MAX);
    for (int i = 0; i < SH_MAX + 8; i++)
        sh_ok(names[i]);
    assert_int_equal(sh_failing(NULL, NULL), 0);
}

/* A failure not repeated within SH_WINDOW_S is forgotten (its statement may simply not have run
 * since); its age is reported until then. */
static void forgotten_after_the_window(void **state)
{
    (void)state;
    static const char poll[] = "poll_claim", reap[] = "reap";
    struct seen s = {0};
    sh_failed_at(poll, "42703", 1000.0);
    sh_failed_at(reap, "0A000", 1000.0 + SH_WINDOW_S / 2);
    assert_int_equal(sh_failing_at(1000.0 + SH_WINDOW_S - 1, collect, &s), 2);
    assert_int_equal(sh_failing_at(1000.0 + SH_WINDOW_S + 1, NULL, NULL), 1);
    memset(&s, 0, sizeof(s));
    assert_int_equal(sh_failing_at(1000.0 + SH_WINDOW_S + 1, collect, &s), 1);
    assert_string_equal(s.names[0], "reap");
    assert_int_equal(sh_failing_at(1000.0 + SH_WINDOW_S * 1.5 + 1, NULL, NULL), 0);
    /* Failing again after being forgotten: counted again. */
    sh_failed_at(poll, "42703", 5000.0);
    assert_int_equal(sh_failing_at(5000.0, NULL, NULL), 1);
    sh_ok(poll);
    assert_int_equal(sh_failing_at(5000.0, NULL, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(which_sqlstates_count),
        cmocka_unit_test(failing_until_the_next_success),
        cmocka_unit_test(at_most_sh_max_tracked),
        cmocka_unit_test(forgotten_after_the_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
