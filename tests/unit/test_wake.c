/* Wake-ups: the done channel's payloads (job ids joined by commas, each NOTIFY under
 * PostgreSQL's 8000-byte limit) and their splitting, one table row per case; the in-process
 * receiver of wake_done and which states wake whom. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemgate/wake.h"

#define N_ROWS(a) (sizeof(a) / sizeof((a)[0]))
#define ID31 "job_aaaaaaaaaaaaaaaaaaaaaaaaaaa" /* 31 characters */
#define ID63 ID31 ID31 "b"                     /* the longest id */
_Static_assert(sizeof(ID63) == WAKE_ID_MAX + 1, "ID63 is the longest id");

struct payload_case {
    const char *ids[6];
    size_t max_payload;
    const char *want; /* the text[] literal */
    size_t elements;
};

static const struct payload_case payload_cases[] = {
    {{NULL}, WAKE_PAYLOAD_MAX, "{}", 0},
    {{"job_a", NULL}, WAKE_PAYLOAD_MAX, "{\"job_a\"}", 1},
    {{"job_a", "job_b", "job_c", NULL}, WAKE_PAYLOAD_MAX, "{\"job_a,job_b,job_c\"}", 1},
    /* Two ids of 31 and a comma fill 63 bytes exactly; a third starts a new payload. */
    {{ID31, ID31, ID31, NULL}, 63, "{\"" ID31 "," ID31 "\",\"" ID31 "\"}", 2},
    {{ID31, ID31, ID31, NULL}, 64, "{\"" ID31 "," ID31 "\",\"" ID31 "\"}", 2},
    {{ID63, ID63, NULL}, 63, "{\"" ID63 "\",\"" ID63 "\"}", 2},
    /* What cannot be a job id never reaches the literal (no quoting is ever needed). */
    {{"", "a,b", "a\"b", "a\\b", "job x", NULL}, WAKE_PAYLOAD_MAX, "{}", 0},
    {{ID63 "c", "job_ok", "{job}", NULL}, WAKE_PAYLOAD_MAX, "{\"job_ok\"}", 1},
    {{"job-1", "JOB_2", NULL}, WAKE_PAYLOAD_MAX, "{\"job-1,JOB_2\"}", 1},
};

static size_t count_ids(const char *const *ids)
{
    size_t n = 0;
    while (ids[n])
        n++;
    return n;
}

static void test_payloads_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS(payload_cases); i++) {
        const struct payload_case *c = &payload_cases[i];
        size_t elements = 99;
        char *got = wake_payloads(c->ids, count_ids(c->ids), c->max_payload, &elements);
        assert_non_null(got);
        if (strcmp(got, c->want) != 0 || elements != c->elements)
            fail_msg("row %zu: got %s (%zu), want %s (%zu)", i, got, elements, c->want,
                     c->elements);
        free(got);
    }
}

static void test_payload_limit_below_an_id_is_refused(void **state)
{
    (void)state;
    const char *ids[] = {"job_a"};
    size_t elements = 7;
    assert_null(wake_payloads(ids, 1, WAKE_ID_MAX - 1, &elements));
    assert_int_equal(elements, 0);
}

struct collected {
    char ids[2048][WAKE_ID_MAX + 1];
    size_t n;
};

static void collect(const char *id, void *arg)
{
    struct collected *c = arg;
    assert_true(c->n < N_ROWS(c->ids));
    snprintf(c->ids[c->n++], sizeof(c->ids[0]), "%s", id);
}

/* Many real job ids: every payload stays under PostgreSQL's limit, as full as it can be, and
 * splitting every payload gives back every id once, in order. */
static void test_payloads_round_trip_under_the_limit(void **state)
{
    (void)state;
    enum { N = 2000 };
    static char buf[N][32];
    static const char *ids[N];
    for (size_t i = 0; i < N; i++) {
        snprintf(buf[i], sizeof(buf[i]), "job_%026zu", i); /* 30 characters, as crypto_job_id */
        ids[i] = buf[i];
    }
    size_t elements = 0;
    char *lit = wake_payloads(ids, N, WAKE_PAYLOAD_MAX, &elements);
    assert_non_null(lit);
    /* 258 ids of 30 characters and their commas take 7 997 bytes; 259 would take 8 028. */
    assert_int_equal(elements, (N + 257) / 258);
    static struct collected got;
    got.n = 0;
    size_t seen = 0;
    assert_true(lit[0] == '{' && lit[strlen(lit) - 1] == '}');
    for (char *p = lit + 1; *p == '"';) {
        char *end = strchr(p + 1, '"');
        assert_non_null(end);
        size_t len = (size_t)(end - p - 1);
        assert_true(len <= WAKE_PAYLOAD_MAX && len < 8000);
        char *payload = strndup(p + 1, len);
        size_t k = wake_split(payload, collect, &got);
        assert_true(k == 258 || got.n == N); /* full, but for the last */
        free(payload);
        seen++;
        p = end + 1;
        if (*p == ',')
            p++;
    }
    assert_int_equal(seen, elements);
    assert_int_equal(got.n, N);
    for (size_t i = 0; i < N; i++)
        assert_string_equal(got.ids[i], ids[i]);
    free(lit);
}

struct split_case {
    const char *payload;
    const char *want; /* the ids passed to the callback, joined by spaces */
};

static const struct split_case split_cases[] = {
    {"", ""},
    {"job_a", "job_a"}, /* one id alone, as the trigger of migration 0001 sent */
    {"job_a,job_b,job_c", "job_a job_b job_c"},
    {",job_a,,job_b,", "job_a job_b"},
    {"job a,job_b", "job_b"},
    {ID63 "c," ID63, ID63},
    {"job_\"x\",job_y", "job_y"},
};

static void join(const char *id, void *arg)
{
    char *out = arg;
    if (*out)
        strcat(out, " ");
    strcat(out, id);
}

static void test_split_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS(split_cases); i++) {
        char got[512] = "";
        wake_split(split_cases[i].payload, join, got);
        if (strcmp(got, split_cases[i].want) != 0)
            fail_msg("row %zu: got \"%s\", want \"%s\"", i, got, split_cases[i].want);
    }
    char none[8] = "";
    assert_int_equal(wake_split(NULL, join, none), 0);
}

static void count_done(const char *id, void *arg)
{
    (void)id;
    ++*(int *)arg;
}

/* wake_done reaches this process's receiver at once; wake_state wakes waiters for the terminal
 * states only. Without wake_start nothing is sent and the work signal has no descriptor. */
static void test_done_receiver(void **state)
{
    (void)state;
    int done = 0;
    assert_int_equal(wake_work_fd(), -1);
    assert_false(wake_is_echo(0));
    wake_on_done(count_done, &done);
    wake_done("job_a");
    assert_int_equal(done, 1);
    wake_state("job_b", ST_COMPLETED);
    wake_state("job_c", ST_FAILED);
    assert_int_equal(done, 3);
    for (int s = ST_PREPARED; s <= ST_REVIEW; s++)
        wake_state("job_d", (enum op_state)s);
    assert_int_equal(done, 3);
    wake_on_done(NULL, NULL);
    wake_done("job_e");
    assert_int_equal(done, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_payloads_table),
        cmocka_unit_test(test_payload_limit_below_an_id_is_refused),
        cmocka_unit_test(test_payloads_round_trip_under_the_limit),
        cmocka_unit_test(test_split_table),
        cmocka_unit_test(test_done_receiver),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
