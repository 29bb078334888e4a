/* The intake pipeline's pure parts: the order of its steps (authentication first, by
 * construction: nobody learns anything about routes or validation before it), and the answers
 * of the intake function the record step reads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/intake.h"
#include "idemgate/store.h"

static void test_step_order(void **state)
{
    (void)state;
    static const char *const want[] = {"authenticate", "validate", "limit",    "canonicalise",
                                       "fingerprint",  "gate",     "cache",    "stage",
                                       "record",       "recorded", "answer"};
    size_t n = sizeof(want) / sizeof(want[0]);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(intake_step_name(i), want[i]);
    assert_null(intake_step_name(n));
}

/* The intake function's answers (migrations/0014), table-driven. */
struct answer_case {
    const char *a;
    int outcome, verdict;
    const char *blocked;
};

static const struct answer_case answer_cases[] = {
    {"0", 0, 0, NULL},
    {"1", 1, 0, NULL},
    {"2", 2, 0, NULL},
    {"1:credential rejected (HTTP 401)", 1, 0, "credential rejected (HTTP 401)"},
    {"2:x", 2, 0, "x"},
    {"1:", 1, 0, ""},
    {"r2", 3, 2, NULL},
    {"r5", 3, 5, NULL},
    {"r1", -1, 0, NULL}, /* within the budget is never a refusal */
    {"r6", -1, 0, NULL},
    {"r22", -1, 0, NULL},
    {"0:x", -1, 0, NULL}, /* a taken key carries nothing */
    {"t", 4, 0, NULL},    /* under a tombstone: its job deleted by retention (migration 0032) */
    {"t:x", -1, 0, NULL},
    {"t2", -1, 0, NULL},
    {"3", -1, 0, NULL},
    {"12", -1, 0, NULL},
    {"", -1, 0, NULL},
    {NULL, -1, 0, NULL},
};

static void test_intake_answer(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(answer_cases) / sizeof(answer_cases[0]); i++) {
        const struct answer_case *c = &answer_cases[i];
        int verdict = -7;
        const char *blocked = "unset";
        print_message("%s\n", c->a ? c->a : "(null)");
        assert_int_equal(store_intake_answer(c->a, &verdict, &blocked), c->outcome);
        if (c->outcome < 0)
            continue;
        assert_int_equal(verdict, c->verdict);
        if (c->blocked)
            assert_string_equal(blocked, c->blocked);
        else
            assert_null(blocked);
    }
}

/* The answers of the action functions (migrations/0023). */
static void test_action_answer(void **state)
{
    (void)state;
    static const struct {
        const char *a;
        int want, verdict;
    } cases[] = {
        {"1", '1', 0},   {"0", '0', 0},   {"n", 'n', 0},   {"r2", 'r', 2}, {"r5", 'r', 5},
        {"r1", 0, 0},    {"r6", 0, 0},    {"r", 0, 0},     {"r22", 0, 0},  {"10", 0, 0},
        {"n1", 0, 0},    {"2", 0, 0},     {"1:x", 0, 0},   {"", 0, 0},     {NULL, 0, 0},
        {"t", 't', 0},   {"t1", 0, 0}, /* regenerate's key under a tombstone (0032) */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int verdict = -7;
        print_message("%s\n", cases[i].a ? cases[i].a : "(null)");
        assert_int_equal(store_action_answer(cases[i].a, &verdict), cases[i].want);
        assert_int_equal(verdict, cases[i].verdict);
    }
}

/* Timestamps are formatted here, not by the database: RFC 3339, UTC, always six digits. */
static void test_stamp(void **state)
{
    (void)state;
    static const struct {
        long long sec;
        long usec;
        const char *want;
    } cases[] = {
        {0, 0, "1970-01-01T00:00:00.000000Z"},
        {1764671971, 123456, "2025-12-02T10:39:31.123456Z"},
        {1764671971, 7, "2025-12-02T10:39:31.000007Z"},
        {951782400, 999999, "2000-02-29T00:00:00.999999Z"}, /* a leap day */
        {4102444799LL, 0, "2099-12-31T23:59:59.000000Z"},
        {1764671971, 1000000, "2025-12-02T10:39:31.000000Z"}, /* out of range: no carry */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[STORE_STAMP_LEN];
        store_stamp(cases[i].sec, cases[i].usec, out);
        assert_string_equal(out, cases[i].want);
    }
}

/* A job's timestamps come from the database as Unix seconds and are formatted here. */
static void test_stamp_epoch(void **state)
{
    (void)state;
    static const struct {
        const char *epoch, *want;
    } cases[] = {
        {"1796209004.137369", "2026-12-02T10:56:44.137369Z"},
        {"1796209004.000000", "2026-12-02T10:56:44.000000Z"},
        {"1796209004", "2026-12-02T10:56:44.000000Z"},
        {"1796209004.1", "2026-12-02T10:56:44.100000Z"},
        {"1796209004.1234567", "2026-12-02T10:56:44.123456Z"}, /* beyond µs: cut */
        {"0", "1970-01-01T00:00:00.000000Z"},
        {"-1.25", "1969-12-31T23:59:58.750000Z"},
        {"-1", "1969-12-31T23:59:59.000000Z"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[STORE_STAMP_LEN];
        assert_int_equal(store_stamp_epoch(cases[i].epoch, out), 0);
        assert_string_equal(out, cases[i].want);
    }
    static const char *const bad[] = {"", ".5", "x", "12a", "1.2.3", "-", "1e9"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char out[STORE_STAMP_LEN];
        assert_int_equal(store_stamp_epoch(bad[i], out), -1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_order),
        cmocka_unit_test(test_intake_answer),
        cmocka_unit_test(test_action_answer),
        cmocka_unit_test(test_stamp),
        cmocka_unit_test(test_stamp_epoch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
