/* The job's JSON view (jobview.c), member by member and in order: every client and the spec
 * read it. Each row is a job as the store returns it and the exact text the view writes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/jobview.h"

/* The members every job has, with nothing known yet. */
static struct store_job base(enum op_state st)
{
    struct store_job j;
    memset(&j, 0, sizeof(j));
    j.id = "job_a1";
    j.idempotency_key = "k-1";
    j.provider = "mock";
    j.route = "images/generations";
    j.state = st;
    j.generation_attempts = 1;
    j.created_at = "2026-12-01T10:00:00Z";
    j.updated_at = "2026-12-01T10:00:01Z";
    j.expires_at = "2026-12-02T10:00:00Z";
    j.outputs_requested = -1;
    j.outputs_received = -1;
    j.cost_micros = -1;
    return j;
}

#define HEAD(state, terminal)                                                                      \
    "{\"id\":\"job_a1\",\"object\":\"job\",\"state\":\"" state "\",\"terminal\":" terminal         \
    ",\"provider\":\"mock\",\"route\":\"images/generations\",\"idempotency_key\":\"k-1\","
#define TIMES(first, finished)                                                                     \
    "\"created_at\":\"2026-12-01T10:00:00Z\",\"updated_at\":\"2026-12-01T10:00:01Z\","             \
    "\"first_sent_at\":" first ",\"finished_at\":" finished                                        \
    ",\"expires_at\":\"2026-12-02T10:00:00Z\","
#define LINKS "\"links\":{\"self\":\"/v1/jobs/job_a1\"}}"

static void check(const struct store_job *j, const char *want)
{
    char *got = jobview_json(j);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void test_a_new_job(void **state)
{
    (void)state;
    struct store_job j = base(ST_PREPARED);
    check(&j, HEAD("prepared",
                   "false") "\"remote_id\":null,\"parent_id\":null,"
                            "\"attempts\":{\"transport\":0,\"generation\":1}," TIMES(
                                "null",
                                "null") "\"result\":null,\"cost\":null,\"usage\":null,\"provider_"
                                        "status\":null,"
                                        "\"profile\":null,\"polls\":0,\"last_error\":null," LINKS);
}

static void test_a_completed_job_with_everything(void **state)
{
    (void)state;
    struct store_job j = base(ST_COMPLETED);
    static unsigned char body[] =
        "{\"data\":[{\"url\":\"https://x/1\"}],\"n\":12345678901234567890}";
    j.remote_id = "task_9";
    j.parent_id = "job_p";
    j.transport_attempts = 2;
    j.generation_attempts = 2;
    j.first_sent_at = "2026-12-01T10:00:00.5Z";
    j.finished_at = "2026-12-01T10:00:09Z";
    j.resp_status = 200;
    j.resp_headers = "{\"x-request-id\":\"r\"}";
    j.resp_body = body;
    j.resp_body_len = sizeof(body) - 1;
    j.outputs = "[{\"url\":\"https://x/1\",\"expires_at\":null}]";
    j.outputs_requested = 2;
    j.outputs_received = 1;
    j.currency = "USD";
    j.reserved_micros = 80000;
    j.cost_micros = 40000;
    j.archive = "[]";
    j.usage = "{\"images\":1}";
    j.resolution = "found";
    j.resolved_by = "alice";
    j.resolved_at = "2026-12-01T10:00:08Z";
    j.blocked_reason = "tripped"; /* terminal: not shown */
    j.provider_status = "succeeded";
    j.profile_id = "replicate";
    j.polls = 3;
    j.last_error = "the cancel came too late";
    j.cancel_requested_at = "2026-12-01T10:00:07Z";
    check(&j,
          HEAD("completed",
               "true") "\"remote_id\":\"task_9\",\"parent_id\":\"job_p\","
                       "\"attempts\":{\"transport\":2,\"generation\":2}," TIMES(
                           "\"2026-12-01T10:00:00.5Z\"",
                           "\"2026-12-01T10:00:09Z\"") "\"result\":{\"status\":200,\"headers\":{"
                                                       "\"x-request-id\":\"r\"},"
                                                       "\"body\":{\"data\":[{\"url\":\"https://x/"
                                                       "1\"}],\"n\":12345678901234567890},"
                                                       "\"outputs\":[{\"url\":\"https://x/"
                                                       "1\",\"expires_at\":null}]},"
                                                       "\"outputs\":{\"requested\":2,\"received\":"
                                                       "1,\"shortfall\":1},"
                                                       "\"cost\":{\"currency\":\"USD\",\"estimate_"
                                                       "micros\":80000,\"micros\":40000},"
                                                       "\"archive\":[],\"usage\":{\"images\":1},"
                                                       "\"resolution\":{\"outcome\":\"found\","
                                                       "\"by\":\"alice\","
                                                       "\"at\":\"2026-12-01T10:00:08Z\"},"
                                                       "\"provider_status\":\"succeeded\","
                                                       "\"profile\":\"replicate\",\"polls\":3,"
                                                       "\"cancel_requested_at\":\"2026-12-01T10:00:"
                                                       "07Z\","
                                                       "\"last_error\":\"the cancel came too "
                                                       "late\"," LINKS);
}

/* A task the provider ended on our cancel: terminal, with its remote id and what it cost. */
static void test_a_canceled_job_keeps_its_task_and_cost(void **state)
{
    (void)state;
    struct store_job j = base(ST_CANCELED);
    j.remote_id = "task_c";
    j.transport_attempts = 1;
    j.first_sent_at = "2026-12-01T10:00:00.5Z";
    j.finished_at = "2026-12-01T10:00:09Z";
    j.currency = "USD";
    j.reserved_micros = 500000;
    j.cost_micros = 500000;
    j.cancel_requested_at = "2026-12-01T10:00:05Z";
    j.provider_status = "canceled";
    j.last_error = "canceled at the provider on our request: x";
    check(&j,
          HEAD("canceled",
               "true") "\"remote_id\":\"task_c\",\"parent_id\":null,"
                       "\"attempts\":{\"transport\":1,\"generation\":1}," TIMES(
                           "\"2026-12-01T10:00:00.5Z\"",
                           "\"2026-12-01T10:00:09Z\"") "\"result\":null,"
                                                       "\"cost\":{\"currency\":\"USD\",\"estimate_"
                                                       "micros\":500000,\"micros\":500000},"
                                                       "\"usage\":null,\"provider_status\":"
                                                       "\"canceled\",\"profile\":null,\"polls\":0,"
                                                       "\"cancel_requested_at\":\"2026-12-01T10:00:"
                                                       "05Z\","
                                                       "\"last_error\":\"canceled at the provider "
                                                       "on our request: x\"," LINKS);
}

/* A body that is not JSON is base64; a job still waiting says why it is blocked; counts
 * without a request have no shortfall; an unsettled cost is null. */
static void test_binary_body_blocked_and_unsettled(void **state)
{
    (void)state;
    struct store_job j = base(ST_PREPARED);
    static unsigned char body[] = {'o', 'k', 0, 0xff};
    j.resp_status = 503;
    j.resp_body = body;
    j.resp_body_len = sizeof(body);
    j.outputs_received = 3;
    j.currency = "EUR";
    j.reserved_micros = 7;
    j.blocked_reason = "HTTP 401";
    check(&j, HEAD("prepared",
                   "false") "\"remote_id\":null,\"parent_id\":null,"
                            "\"attempts\":{\"transport\":0,\"generation\":1}," TIMES(
                                "null",
                                "null") "\"result\":{\"status\":503,\"body_base64\":\"b2sA/w==\"},"
                                        "\"outputs\":{\"received\":3},"
                                        "\"cost\":{\"currency\":\"EUR\",\"estimate_micros\":7,"
                                        "\"micros\":null},"
                                        "\"usage\":null,\"blocked\":{\"reason\":\"HTTP "
                                        "401\"},\"provider_status\":null,"
                                        "\"profile\":null,\"polls\":0,\"last_error\":null," LINKS);
}

/* A provider's body is embedded as is only when it is JSON by RFC 8259's grammar: what cJSON
 * also takes (a leading zero, a raw control character in a string, a trailing comma) made the
 * whole view unreadable to a client's parser. Rows: the body, whether it is embedded. */
struct body_case {
    const char *body;
    int embedded;
};

static const struct body_case body_cases[] = {
    {"{\"url\":\"https://x/0.png\",\"n\":1}", 1},
    {"[1, 2.5e3, -0, true, null]", 1},
    {" {\"a\" : \"\\u00e9\"} ", 1},
    {"12345678901234567890123", 1}, /* exact: embedded as is, never rounded */
    {"01", 0},
    {"{\"a\":\"x\ty\"}", 0}, /* a raw tab in a string */
    {"{\"a\":1,}", 0},
    {"[1,]", 0},
    {"{\"a\":1,\"a\":2}", 0}, /* a repeated name: base64, not one reading of it */
    {"1e999", 0},
    {"nul", 0},
    {"{\"a\":1} x", 0},
    {"", 0},
    {"\"\xff\"", 0}, /* invalid UTF-8 */
};

static void test_a_body_is_embedded_only_when_it_is_strict_json(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(body_cases) / sizeof(body_cases[0]); i++) {
        struct store_job j = base(ST_COMPLETED);
        j.resp_status = 200;
        j.resp_body = (unsigned char *)body_cases[i].body;
        j.resp_body_len = strlen(body_cases[i].body);
        char *got = jobview_json(&j);
        assert_non_null(got);
        char want[256];
        snprintf(want, sizeof(want), "\"result\":{\"status\":200,\"body\":%s}",
                 body_cases[i].body);
        int embedded = strstr(got, want) != NULL;
        int b64 = strstr(got, "\"result\":{\"status\":200,\"body_base64\":\"") != NULL;
        if (embedded != body_cases[i].embedded || b64 == body_cases[i].embedded)
            fail_msg("case %zu (%s): %s", i, body_cases[i].body, got);
        free(got);
    }
}

/* Every terminal state says so; no other does. */
static void test_terminal_flag(void **state)
{
    (void)state;
    for (int s = 0; s < ST__COUNT; s++) {
        struct store_job j = base((enum op_state)s);
        char *got = jobview_json(&j);
        assert_non_null(got);
        int terminal = s == ST_COMPLETED || s == ST_FAILED || s == ST_CANCELED;
        assert_non_null(strstr(got, terminal ? "\"terminal\":true" : "\"terminal\":false"));
        free(got);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_new_job),
        cmocka_unit_test(test_a_body_is_embedded_only_when_it_is_strict_json),
        cmocka_unit_test(test_a_completed_job_with_everything),
        cmocka_unit_test(test_a_canceled_job_keeps_its_task_and_cost),
        cmocka_unit_test(test_binary_body_blocked_and_unsettled),
        cmocka_unit_test(test_terminal_flag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
