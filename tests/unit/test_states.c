/* The state machine's edges, listed exhaustively: every pair not in the table is forbidden. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "idemgate/states.h"

struct edge {
    enum op_state from, to;
};

static const struct edge allowed[] = {
    {ST_PREPARED, ST_SENDING},  {ST_PREPARED, ST_FAILED},  {ST_PREPARED, ST_UNKNOWN},
    {ST_SENDING, ST_PREPARED},  {ST_SENDING, ST_ACCEPTED}, {ST_SENDING, ST_UNKNOWN},
    {ST_SENDING, ST_COMPLETED}, {ST_SENDING, ST_FAILED},
    {ST_ACCEPTED, ST_COMPLETED}, {ST_ACCEPTED, ST_FAILED}, {ST_ACCEPTED, ST_CANCELED},
    {ST_ACCEPTED, ST_REVIEW},
    {ST_UNKNOWN, ST_SENDING},   {ST_UNKNOWN, ST_PREPARED}, {ST_UNKNOWN, ST_ACCEPTED},
    {ST_UNKNOWN, ST_COMPLETED}, {ST_UNKNOWN, ST_REVIEW},   {ST_UNKNOWN, ST_FAILED},
    {ST_REVIEW, ST_PREPARED},   {ST_REVIEW, ST_ACCEPTED},  {ST_REVIEW, ST_COMPLETED},
    {ST_REVIEW, ST_FAILED},     {ST_REVIEW, ST_UNKNOWN},
};

static int in_table(enum op_state from, enum op_state to)
{
    for (size_t i = 0; i < sizeof(allowed) / sizeof(allowed[0]); i++)
        if (allowed[i].from == from && allowed[i].to == to)
            return 1;
    return 0;
}

static void test_every_pair(void **state)
{
    (void)state;
    for (int f = 0; f < ST__COUNT; f++)
        for (int t = 0; t < ST__COUNT; t++)
            assert_int_equal(st_can_transition((enum op_state)f, (enum op_state)t),
                             in_table((enum op_state)f, (enum op_state)t));
}

static void test_terminal_states_never_change(void **state)
{
    (void)state;
    for (int t = 0; t < ST__COUNT; t++) {
        assert_false(st_can_transition(ST_COMPLETED, (enum op_state)t));
        assert_false(st_can_transition(ST_FAILED, (enum op_state)t));
        assert_false(st_can_transition(ST_CANCELED, (enum op_state)t));
    }
    assert_true(st_is_terminal(ST_COMPLETED));
    assert_true(st_is_terminal(ST_FAILED));
    assert_true(st_is_terminal(ST_CANCELED));
    assert_false(st_is_terminal(ST_REVIEW));
    assert_false(st_is_terminal(ST_UNKNOWN));
}

static void test_names_round_trip(void **state)
{
    (void)state;
    for (int s = 0; s < ST__COUNT; s++)
        assert_int_equal(st_parse(st_name((enum op_state)s)), s);
    assert_int_equal(st_parse("bogus"), -1);
    assert_string_equal(st_name(ST__COUNT), "invalid");
    assert_false(st_can_transition(ST__COUNT, ST_PREPARED));
}

/* One resolution decision for the API and the CLI: a found task at an async provider is polled,
 * never completed without its outputs; a cancelled job is never sent again. */
/* A row is recorded prepared, or born claimed: sending, the one state prepared reaches by a claim.
 * Never anything that needs an attempt first. */
static void test_initial_states(void **state)
{
    (void)state;
    static const int want[ST__COUNT] = {[ST_PREPARED] = 1};
    for (int s = 0; s < ST__COUNT; s++) {
        assert_int_equal(st_is_initial((enum op_state)s), want[s]);
        if (s != ST_PREPARED && want[s])
            assert_true(st_can_transition(ST_PREPARED, (enum op_state)s));
    }
}

static void test_resolutions(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int async, readable, cancel;
        enum op_state want;
    } rows[] = {
        {"found", 0, 0, 0, ST_COMPLETED},  {"found", 0, 1, 0, ST_UNKNOWN},
        {"found", 1, 0, 0, ST_ACCEPTED},   {"found", 1, 1, 1, ST_ACCEPTED},
        {"absent", 0, 0, 0, ST_PREPARED},  {"absent", 1, 1, 0, ST_PREPARED},
        {"absent", 0, 0, 1, ST_FAILED},    {"abandon", 0, 0, 0, ST_FAILED},
        {"abandon", 1, 1, 1, ST_FAILED},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        int r = st_resolution_parse(rows[i].name);
        assert_true(r >= 0);
        enum op_state got = st_resolve_target((enum st_resolution)r, rows[i].async, rows[i].readable,
                                         rows[i].cancel);
        if (got != rows[i].want)
            fail_msg("row %zu: %s", i, st_name(got));
        assert_true(st_can_transition(ST_REVIEW, got));
    }
    assert_int_equal(st_resolution_parse("foun"), -1);
    assert_int_equal(st_resolution_parse(NULL), -1);
}

/* An `absent` on a job whose task was seen is refused unless forced: sent again (prepared) or
 * failed at cost 0 (a cancelled job). */
static void test_a_known_task_is_not_sent_again(void **state)
{
    (void)state;
    static const struct {
        enum st_resolution r;
        enum op_state next;
        int known, forced, want;
    } rows[] = {
        {RES_ABSENT, ST_PREPARED, 1, 0, 1}, {RES_ABSENT, ST_PREPARED, 1, 1, 0},
        {RES_ABSENT, ST_PREPARED, 0, 0, 0}, {RES_ABSENT, ST_FAILED, 1, 0, 1},
        {RES_FOUND, ST_ACCEPTED, 1, 0, 0},  {RES_ABANDON, ST_FAILED, 1, 0, 0},
        {RES_ABSENT, ST_FAILED, 1, 1, 0},   {RES_ABSENT, ST_FAILED, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (st_resend_refused(rows[i].r, rows[i].next, rows[i].known, rows[i].forced) !=
            rows[i].want)
            fail_msg("row %zu", i);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_pair),
        cmocka_unit_test(test_terminal_states_never_change),
        cmocka_unit_test(test_names_round_trip),
        cmocka_unit_test(test_resolutions),
        cmocka_unit_test(test_a_known_task_is_not_sent_again),
        cmocka_unit_test(test_initial_states),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
