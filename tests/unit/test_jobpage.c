/* The job list's cursor (jobpage.h): what it makes parses back to the same stamp and id, and
 * nothing else parses. Table-driven. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/jobpage.h"

static void test_cursor_round_trip(void **state)
{
    (void)state;
    static const struct {
        const char *stamp, *id;
        int ok;
    } cases[] = {
        {"2026-12-03T09:45:01.123456Z", "job_abcdefghijklmnopqrstuvwxyz", 1},
        {"1970-01-01T00:00:00.000000Z", "x", 1},
        {"2026-12-03T09:45:01.123456Z", "job-with-dash_9", 1},
        {"2026-12-03T09:45:01Z", "job_a", 0},               /* no microseconds */
        {"2026-12-03 09:45:01.123456Z", "job_a", 0},        /* a space, not T */
        {"2026-12-03T09:45:01.123456+00:00", "job_a", 0},   /* an offset, not Z */
        {"2026-12-03T09:45:01.123456Z", "", 0},
        {"2026-12-03T09:45:01.123456Z", "job~a", 0},
        {"2026-12-03T09:45:01.123456Z", "job a", 0},
        {"2026-12-03T09:45:01.123456Z",
         "ab123456789012345678901234567890123456789012345678901234567890123", 0}, /* 65 */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char c[JOBPAGE_CURSOR_LEN], stamp[28], id[65];
        print_message("%s %s\n", cases[i].stamp, cases[i].id);
        int made = jobpage_cursor(cases[i].stamp, cases[i].id, c);
        assert_int_equal(made, cases[i].ok ? 0 : -1);
        if (!cases[i].ok)
            continue;
        assert_int_equal(jobpage_cursor_parse(c, stamp, id), 0);
        assert_string_equal(stamp, cases[i].stamp);
        assert_string_equal(id, cases[i].id);
    }
}

static void test_cursor_parse_rejects(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        "~",
        "job_a",
        "2026-12-03T09:45:01.123456Z",
        "2026-12-03T09:45:01.123456Z~",
        "~job_a",
        "2026-12-03T09:45:01.12345Z~job_a",
        "2026-12-03T09:45:01.1234567Z~job_a",
        "2026-12-03T09:45:0a.123456Z~job_a",
        "2026-12-03T09:45:01.123456Z~job_a~b",
        "2026-12-03T09:45:01.123456Z~job_a'",
        "x2026-12-03T09:45:01.123456Z~job_a",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char stamp[28], id[65];
        print_message("%s\n", bad[i]);
        assert_int_equal(jobpage_cursor_parse(bad[i], stamp, id), -1);
    }
    char stamp[28], id[65];
    assert_int_equal(jobpage_cursor_parse(NULL, stamp, id), -1);
}

/* A job is past the page at the limit, or once the bodies before it reach JOBPAGE_BODY_BYTES —
 * never the first, whatever its body. */
static void test_a_page_is_cut_by_its_limit_or_its_bodies(void **state)
{
    (void)state;
    static const struct {
        int n, limit;
        size_t bytes;
        int want;
    } rows[] = {
        {0, 100, 0, 0},
        {0, 100, JOBPAGE_BODY_BYTES * 4, 0},
        {1, 100, JOBPAGE_BODY_BYTES - 1, 0},
        {1, 100, JOBPAGE_BODY_BYTES, 1},
        {99, 100, 10, 0},
        {100, 100, 0, 1},
        {5, 1, 0, 1},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (jobpage_past(rows[i].n, rows[i].limit, rows[i].bytes) != rows[i].want)
            fail_msg("row %zu", i);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cursor_round_trip),
        cmocka_unit_test(test_a_page_is_cut_by_its_limit_or_its_bodies),
        cmocka_unit_test(test_cursor_parse_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
