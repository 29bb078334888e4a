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
    static const char *const histograms[] = {"idemgate_http_request_duration_seconds",
                                             "idemgate_unknown_duration_seconds"};
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    size_t n = strcspn(line, "{ ");
    snprintf(out, cap, "%.*s", (int)n, line);
    for (size_t h = 0; h < 2; h++) {
        size_t hl = strlen(histograms[h]);
        for (size_t i = 0; i < 3; i++)
            if (strncmp(out, histograms[h], hl) == 0 && strcmp(out + hl, suffixes[i]) == 0)
                out[hl] = '\0';
    }
}

static void test_every_sample_follows_its_declaration(void **state)
{
    (void)state;
    metrics_http(MR_INTAKE, 202, 0.003);
    metrics_http(MR_METRICS, 200, 100.0);
    metrics_attempt("success");
    metrics_spend("p", "USD", 5, 1);
    metrics_archive(2);
    char *text = metrics_render("# HELP x_extra E.\n# TYPE x_extra gauge\nx_extra 1\n");
    assert_non_null(text);
    char declared[128][96];
    size_t n_declared = 0;
    int helps = 0;
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
        } else if (strncmp(l, "# HELP ", 7) == 0) {
            helps++;
        } else {
            family_of(l, fam, sizeof(fam));
            int found = 0;
            for (size_t i = 0; i < n_declared; i++)
                found |= strcmp(declared[i], fam) == 0;
            if (!found)
                fail_msg("sample before its # TYPE: %s", l);
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
    char *after = metrics_render(NULL);
    assert_true(sample(after, "idemgate_review_entered_total") ==
                sample(before, "idemgate_review_entered_total") + 1);
    assert_true(sample(after, "idemgate_intake_batches_total{result=\"split\"}") ==
                sample(before, "idemgate_intake_batches_total{result=\"split\"}") + 1);
    assert_true(sample(after, "idemgate_intake_batched_intents_total") ==
                sample(before, "idemgate_intake_batched_intents_total") + 4);
    assert_true(sample(after, "idemgate_archive_outputs_total{outcome=\"archived\"}") ==
                sample(before, "idemgate_archive_outputs_total{outcome=\"archived\"}") + 1);
    assert_true(sample(after, "idemgate_spend_micros_total{provider=\"q\",currency=\"EUR\"}") == 7);
    free(before);
    free(after);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_sample_follows_its_declaration),
        cmocka_unit_test(test_histograms_are_cumulative),
        cmocka_unit_test(test_counters_move_with_their_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
