/* metrics_render (split into one function per family, issue 21 item 14): the text is well-formed
 * Prometheus exposition whatever the counters hold. Every sample belongs to a family declared
 * once (# HELP and # TYPE) before it; a histogram's buckets are cumulative and its +Inf bucket
 * is its count; counters move with their events. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "idemgate/metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The value of the sample line that starts with `name ` (labels included), or -1. */
static double sample(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strncmp(l, name, n) == 0 && l[n] == ' ')
            return atof(l + n + 1);
    return -1;
}

/* The family a sample belongs to: its name without labels, and without the _bucket, _sum and
 * _count suffixes of the histograms. */
static void family_of(const char *line, char *out, size_t cap)
{
    static const char *const histograms[] = {
        "idemgate_http_request_duration_seconds", "idemgate_unknown_duration_seconds",
        "idemgate_upstream_duration_seconds", "idemgate_job_duration_seconds"};
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    size_t n = strcspn(line, "{ ");
    snprintf(out, cap, "%.*s", (int)n, line);
    for (size_t h = 0; h < sizeof(histograms) / sizeof(histograms[0]); h++) {
        size_t hl = strlen(histograms[h]);
        for (size_t i = 0; i < 3; i++)
            if (strncmp(out, histograms[h], hl) == 0 && strcmp(out + hl, suffixes[i]) == 0)
                out[hl] = '\0';
    }
}

/* Every family's samples come together, right after its own # TYPE: a family whose samples are
 * split by another's (idemgate_operations was, around idemgate_review_backlog) is read by a
 * standard parser as a second, untyped family. */
static void test_every_sample_follows_its_declaration(void **state)
{
    (void)state;
    metrics_http(MR_INTAKE, 202, 0.003);
    metrics_http(MR_METRICS, 200, 100.0);
    metrics_attempt("a", "success");
    metrics_attempt("unconfigured", "ambiguous");
    metrics_upstream_seconds("a", 0.3);
    metrics_job_seconds("b", 12);
    metrics_spend("p", "USD", 5, 1);
    metrics_spend("r", "EUR", 5, 0);
    metrics_archive(2);
    char *text = metrics_render("# HELP x_extra E.\n# TYPE x_extra gauge\nx_extra 1\n");
    assert_non_null(text);
    char declared[128][96];
    size_t n_declared = 0;
    int helps = 0;
    char current[96] = ""; /* the family of the last # TYPE */
    for (char *l = text; *l;) {
        char *nl = strchr(l, '\n');
        assert_non_null(nl); /* every line ends */
        *nl = '\0';
        char fam[96];
        if (strncmp(l, "# TYPE ", 7) == 0) {
            family_of(l + 7, fam, sizeof(fam));
            for (size_t i = 0; i < n_declared; i++)
                assert_string_not_equal(declared[i], fam); /* declared once */
            assert_true(n_declared < 128);
            snprintf(declared[n_declared++], sizeof(declared[0]), "%s", fam);
            snprintf(current, sizeof(current), "%s", fam);
        } else if (strncmp(l, "# HELP ", 7) == 0) {
            helps++;
        } else {
            family_of(l, fam, sizeof(fam));
            int found = 0;
            for (size_t i = 0; i < n_declared; i++)
                found |= strcmp(declared[i], fam) == 0;
            if (!found)
                fail_msg("sample before its # TYPE: %s", l);
            if (strcmp(fam, current) != 0)
                fail_msg("sample of %s under the # TYPE of %s: %s", fam, current, l);
        }
        *nl = '\n';
        l = nl + 1;
    }
    assert_int_equal(helps, (int)n_declared);
    free(text);
}

static void test_histograms_are_cumulative(void **state)
{
    (void)state;
    metrics_http(MR_JOB_GET, 200, 0.0001);
    metrics_http(MR_JOB_GET, 200, 0.2);
    metrics_http(MR_JOB_GET, 200, 1000);
    metrics_unknown_seconds(10);
    char *text = metrics_render(NULL);
    assert_non_null(text);
    const char *p = "idemgate_http_request_duration_seconds_bucket{route=\"job_get\",le=\"0.001\"}";
    assert_true(sample(text, p) >= 1);
    double small = sample(text, p);
    double mid = sample(
        text, "idemgate_http_request_duration_seconds_bucket{route=\"job_get\",le=\"0.25\"}");
    double inf = sample(
        text, "idemgate_http_request_duration_seconds_bucket{route=\"job_get\",le=\"+Inf\"}");
    double count = sample(text, "idemgate_http_request_duration_seconds_count{route=\"job_get\"}");
    assert_true(small <= mid && mid < inf);
    assert_true(inf == count && count >= 3);
    assert_true(sample(text, "idemgate_unknown_duration_seconds_bucket{le=\"+Inf\"}") ==
                sample(text, "idemgate_unknown_duration_seconds_count"));
    free(text);
}

static void test_counters_move_with_their_events(void **state)
{
    (void)state;
    char *before = metrics_render(NULL);
    metrics_safety(MS_REVIEW_ENTERED);
    metrics_intake_batch(4, 0, 1);
    metrics_archive(0);
    metrics_spend("q", "EUR", 7, 0);
    metrics_upstream_seconds("b", 1);
    char *after = metrics_render(NULL);
    assert_true(sample(after, "idemgate_review_entered_total") ==
                sample(before, "idemgate_review_entered_total") + 1);
    assert_true(sample(after, "idemgate_intake_batches_total{result=\"split\"}") ==
                sample(before, "idemgate_intake_batches_total{result=\"split\"}") + 1);
    assert_true(sample(after, "idemgate_intake_batched_intents_total") ==
                sample(before, "idemgate_intake_batched_intents_total") + 4);
    assert_true(sample(after, "idemgate_archive_outputs_total{outcome=\"archived\"}") ==
                sample(before, "idemgate_archive_outputs_total{outcome=\"archived\"}") + 1);
    assert_true(sample(after, "idemgate_spend_micros_total{provider=\"q\",currency=\"EUR\"}") ==
                7); /* a new pair: no series before */
    free(before);
    free(after);
}

/* Attempts and both latency histograms are labelled by provider: the configured names, at 0
 * before anything happened, and "other" for a name outside the configuration (a bounded set). */
static void test_provider_families(void **state)
{
    (void)state;
    char *before = metrics_render(NULL);
    metrics_attempt("a", "success");
    metrics_attempt("a", "success");
    metrics_attempt("b", "ambiguous");
    metrics_upstream_seconds("a", 0.2);
    metrics_upstream_seconds("a", 400);
    metrics_job_seconds("b", 45);
    metrics_job_seconds("zz-not-configured", 3);
    char *after = metrics_render(NULL);
    assert_non_null(before);
    assert_non_null(after);
#define DELTA(name) (sample(after, name) - sample(before, name))
    assert_true(DELTA("idemgate_attempts_total{provider=\"a\",outcome=\"success\"}") == 2);
    assert_true(DELTA("idemgate_attempts_total{provider=\"b\",outcome=\"ambiguous\"}") == 1);
    assert_true(DELTA("idemgate_attempts_total{provider=\"b\",outcome=\"success\"}") == 0);
    assert_true(sample(after, "idemgate_attempts_total{provider=\"b\",outcome=\"success\"}") >= 0);
    /* A call of 0.2 s is in the 0.25 bucket, not the 0.1; one of 400 s only in +Inf. */
    assert_true(DELTA("idemgate_upstream_duration_seconds_bucket{provider=\"a\",le=\"0.1\"}") == 0);
    assert_true(DELTA("idemgate_upstream_duration_seconds_bucket{provider=\"a\",le=\"0.25\"}") == 1);
    assert_true(DELTA("idemgate_upstream_duration_seconds_bucket{provider=\"a\",le=\"300\"}") == 1);
    assert_true(DELTA("idemgate_upstream_duration_seconds_bucket{provider=\"a\",le=\"+Inf\"}") == 2);
    assert_true(DELTA("idemgate_upstream_duration_seconds_count{provider=\"a\"}") == 2);
    assert_true(DELTA("idemgate_upstream_duration_seconds_sum{provider=\"a\"}") > 400.1);
    assert_true(sample(after, "idemgate_upstream_duration_seconds_count{provider=\"b\"}") >= 0);
    assert_true(DELTA("idemgate_job_duration_seconds_bucket{provider=\"b\",le=\"30\"}") == 0);
    assert_true(DELTA("idemgate_job_duration_seconds_bucket{provider=\"b\",le=\"60\"}") == 1);
    assert_true(sample(after, "idemgate_job_duration_seconds_count{provider=\"other\"}") >= 1);
    assert_null(strstr(after, "zz-not-configured"));
#undef DELTA
    free(before);
    free(after);
}

/* The spend of every priced provider is a series from the start, at 0 (increase() and alerts
 * need the 0); an unpriced provider has none. */
static void test_spend_starts_at_zero(void **state)
{
    (void)state;
    char *text = metrics_render(NULL);
    assert_non_null(text);
    assert_true(sample(text, "idemgate_spend_micros_total{provider=\"b\",currency=\"USD\"}") == 0);
    assert_true(
        sample(text, "idemgate_settled_operations_total{provider=\"b\",currency=\"USD\"}") == 0);
    assert_true(
        sample(text, "idemgate_unpriced_operations_total{provider=\"b\",currency=\"USD\"}") == 0);
    assert_null(strstr(text, "idemgate_spend_micros_total{provider=\"a\""));
    free(text);
}

/* The process figures come from /proc, as the Prometheus client libraries name them, and the
 * build says what it is. */
static void test_process_and_build(void **state)
{
    (void)state;
    char *text = metrics_render(NULL);
    assert_non_null(text);
    assert_true(sample(text, "process_resident_memory_bytes") > 1e5);
    assert_true(sample(text, "process_virtual_memory_bytes") >= sample(text, "process_resident_memory_bytes"));
    assert_true(sample(text, "process_cpu_seconds_total") >= 0);
    assert_true(sample(text, "process_open_fds") >= 3);
    assert_true(sample(text, "process_max_fds") >= sample(text, "process_open_fds"));
    /* Started within the last day, not in the future (boot time + ticks since boot). */
    double start = sample(text, "process_start_time_seconds");
    time_t now = time(NULL);
    assert_true(start > (double)now - 86400 && start <= (double)now + 1);
    assert_non_null(strstr(text, "\nidemgate_build_info{version=\""));
    assert_non_null(strstr(text, "# TYPE process_cpu_seconds_total counter\n"));
    free(text);
}

/* /proc/<pid>/stat: the command may hold spaces and parentheses; fields count from the last ')'. */
static void test_parse_proc_stat(void **state)
{
    (void)state;
    static const char stat[] =
        "4242 (ig (x) y) S 1 4242 4242 0 -1 4194560 1033 0 0 0 250 150 0 0 20 0 9 0 "
        "123456 1073741824 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
    struct metrics_proc p;
    assert_int_equal(metrics_parse_proc_stat(stat, 100, 4096, &p), 0);
    assert_true(p.cpu_seconds == 4.0);
    assert_true(p.virtual_bytes == 1073741824.0);
    assert_true(p.resident_bytes == 2048.0 * 4096);
    assert_true(p.start_ticks == 123456);
    assert_int_equal(metrics_parse_proc_stat("4242 (ig) S 1 2", 100, 4096, &p), -1);
    assert_int_equal(metrics_parse_proc_stat("no parenthesis", 100, 4096, &p), -1);
    assert_int_equal(metrics_parse_proc_stat(NULL, 100, 4096, &p), -1);
}

static int setup_providers(void **state)
{
    (void)state;
    static const char *const names[] = {"a", "b"};
    static const char *const currencies[] = {NULL, "USD"};
    metrics_providers(names, currencies, 2);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spend_starts_at_zero),
        cmocka_unit_test(test_provider_families),
        cmocka_unit_test(test_process_and_build),
        cmocka_unit_test(test_parse_proc_stat),
        cmocka_unit_test(test_every_sample_follows_its_declaration),
        cmocka_unit_test(test_histograms_are_cumulative),
        cmocka_unit_test(test_counters_move_with_their_events),
    };
    return cmocka_run_group_tests(tests, setup_providers, NULL);
}
