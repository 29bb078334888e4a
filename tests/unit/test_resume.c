/* Resuming a cut stream (resume.h, issue 25 §3): where a Responses stream created with
 * "background" is resumed from (the last whole event's sequence number, the record's bytes
 * through it), when it is not resumed at all, the record joined with what followed, the resume's
 * URL, and the profile member that says how (reconcile.task.resume). Table-driven. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/profile.h"
#include "idemgate/provider.h"
#include "idemgate/resume.h"
#include "idemgate/sse.h"

#define RESUME_NO_START                                                                            \
    "\"resume\":{\"query\":\"stream=true&starting_after={after}\",\"when\":\"$.background\","    \
    "\"sequence\":\"$.sequence_number\"}"
#define RESUME                                                                                     \
    "\"resume\":{\"query\":\"stream=true&starting_after={after}\",\"when\":\"$.background\","    \
    "\"sequence\":\"$.sequence_number\",\"start_query\":\"stream=true\"}"

/* Loads one provider with extra members after its routes: prof_load_all's answer, the provider
 * in *ps (free with prof_free_all), the error in err. */
static int load(const char *extra, struct cfg_provider **ps, size_t *n, char *err, size_t errlen)
{
    char text[1024];
    snprintf(text, sizeof(text),
             "[{\"name\":\"p\",\"base_url\":\"https://example.test\",\"routes\":[{\"route\":"
             "\"r\",\"method\":\"POST\",\"path\":\"/r\"}],%s}]",
             extra);
    cJSON *arr = cJSON_Parse(text);
    assert_non_null(arr);
    *ps = NULL;
    *n = 0;
    int rc = prof_load_all(arr, "t.json", ".", ps, n, err, errlen);
    cJSON_Delete(arr);
    return rc;
}

static void test_profile_member(void **state)
{
    (void)state;
    static const struct {
        const char *extra;
        int ok;
        const char *want_err;
    } rows[] = {
        {"\"stream\":\"openai-responses\",\"reconcile\":{\"task\":{\"path\":\"/t/{id}\"," RESUME
         "}}",
         1, NULL},
        /* not a stream, or no task path of its own, or an async profile: nothing to resume */
        {"\"reconcile\":{\"task\":{\"path\":\"/t/{id}\"," RESUME "}}", 0,
         "reconcile.task.resume: only for"},
        {"\"stream\":\"openai-responses\",\"reconcile\":{\"task\":{" RESUME "}}", 0,
         "reconcile.task.path is required"},
        {"\"stream\":\"openai-responses\",\"reconcile\":{\"task\":{\"path\":\"/t/{id}\","
         "\"resume\":{\"query\":\"stream=true\",\"when\":\"$.b\",\"sequence\":\"$.n\"}}}",
         0, "must hold {after}"},
        {"\"stream\":\"openai-responses\",\"reconcile\":{\"task\":{\"path\":\"/t/{id}\","
         "\"resume\":{\"query\":\"?after={after}\",\"when\":\"$.b\",\"sequence\":\"$.n\"}}}",
         0, "the query alone"},
        {"\"stream\":\"openai-responses\",\"reconcile\":{\"task\":{\"path\":\"/t/{id}\","
         "\"resume\":{\"query\":\"after={id}\",\"when\":\"$.b\",\"sequence\":\"$.n\"}}}",
         0, "resume.query"},
        {"\"stream\":\"openai-responses\",\"reconcile\":{\"task\":{\"path\":\"/t/{id}\","
         "\"resume\":{\"query\":\"after={after}\",\"sequence\":\"$.n\"}}}",
         0, "resume.when is required"},
        {"\"stream\":\"openai-responses\",\"reconcile\":{\"task\":{\"path\":\"/t/{id}\","
         "\"resume\":{\"query\":\"a={after}\",\"start_query\":\"?stream=true\",\"when\":"
         "\"$.b\",\"sequence\":\"$.n\"}}}",
         0, "start_query: is the query alone"},
        {"\"stream\":\"openai-responses\",\"reconcile\":{\"task\":{\"path\":\"/t/{id}\","
         "\"resume\":{\"query\":\"a={after}\",\"start_query\":\"a={after}\",\"when\":"
         "\"$.b\",\"sequence\":\"$.n\"}}}",
         0, "resume.start_query"},
        {"\"stream\":\"openai-responses\",\"reconcile\":{\"task\":{\"path\":\"/t/{id}\","
         "\"resume\":{\"query\":\"after={after}\",\"when\":\"$.b\"}}}",
         0, "resume.sequence is required"},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        struct cfg_provider *ps;
        size_t n;
        char err[512] = "";
        int rc = load(rows[i].extra, &ps, &n, err, sizeof(err));
        if ((rc == 0) != rows[i].ok || (rc != 0 && !strstr(err, rows[i].want_err)))
            fail_msg("row %zu: rc %d, err %s", i, rc, err);
        if (rc == 0) {
            char *url = prov_resume_url(&ps[0], "resp_1", 41);
            assert_string_equal(url, "https://example.test/t/resp_1?stream=true&starting_after=41");
            free(url);
        }
        if (ps)
            prof_free_all(ps, n);
    }
}

#define EV(type, n) "event: " type "\ndata: {\"type\":\"" type "\",\"sequence_number\":" #n "}\n\n"

/* The first event of generation resp_1 (it names it), and of another one. */
#define CREATED(id)                                                                                \
    "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,"         \
    "\"response\":{\"id\":\"" id "\",\"object\":\"response\"}}\n\n"
#define TWO CREATED("resp_1") EV("response.in_progress", 1)

static void test_resume_point(void **state)
{
    (void)state;
    struct cfg_provider *ps, *nostart;
    size_t np, nn;
    char err[512] = "";
    assert_int_equal(load("\"stream\":\"openai-responses\",\"reconcile\":{\"task\":{\"path\":"
                          "\"/t/{id}\"," RESUME "}}",
                          &ps, &np, err, sizeof(err)),
                     0);
    assert_int_equal(load("\"stream\":\"openai-responses\",\"reconcile\":{\"task\":{\"path\":"
                          "\"/t/{id}\"," RESUME_NO_START "}}",
                          &nostart, &nn, err, sizeof(err)),
                     0);
    static const char bg[] = "{\"model\":\"m\",\"stream\":true,\"background\":true}";
    static const struct {
        const char *req, *rec;
        int want;           /* with resume.start_query */
        int want_no_start;  /* without it */
        long long after;    /* -1: from the start */
        size_t prefix;      /* (size_t)-1: the whole record */
    } rows[] = {
        {bg, TWO, 1, 1, 1, (size_t)-1},
        /* an event cut off mid-way is never resumed from: the whole ones before it are */
        {bg, TWO "event: response.output_text.delta\ndata: {\"sequence_number\":2", 1, 1, 1,
         sizeof(TWO) - 1},
        {bg, TWO "event: response.output_text.delta\n", 1, 1, 1, sizeof(TWO) - 1},
        /* CRLF lines: the prefix ends after the blank line */
        {bg, "event: a\r\ndata: {\"sequence_number\":7,\"response\":{\"id\":\"resp_1\"}}\r\n\r\n",
         1, 1, 7, (size_t)-1},
        /* not a background response: the provider does not keep generating it */
        {"{\"stream\":true}", TWO, 0, 0, 0, 0},
        {"{\"stream\":true,\"background\":false}", TWO, 0, 0, 0, 0},
        {"not json", TWO, 0, 0, 0, 0},
        /* nothing of this generation kept (killed before the first batch; an earlier attempt's
         * answer; nothing whole; a last event without a usable number): from the start */
        {bg, "", 1, 0, -1, 0},
        {bg, CREATED("resp_0") EV("response.in_progress", 1), 1, 0, -1, 0},
        {bg, "{\"error\":{\"type\":\"rate_limit_exceeded\"}}", 1, 0, -1, 0},
        {bg, "event: response.created\ndata: {\"sequence_number\":0", 1, 0, -1, 0},
        {bg, CREATED("resp_1") "data: {\"sequence_number\":\"1\"}\n\n", 1, 0, -1, 0},
        {bg, CREATED("resp_1") "data: {\"sequence_number\":1.5}\n\n", 1, 0, -1, 0},
        {bg, CREATED("resp_1") "data: {\"sequence_number\":-1}\n\n", 1, 0, -1, 0},
        {bg, CREATED("resp_1") "data: [DONE]\n\n", 1, 0, -1, 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        struct resume_point pt;
        size_t len = strlen(rows[i].rec);
        int r = resume_point(&ps[0], rows[i].req, strlen(rows[i].req), rows[i].rec, len,
                             "resp_1", &pt);
        size_t prefix = rows[i].prefix == (size_t)-1 ? len : rows[i].prefix;
        if (r != rows[i].want || (r == 1 && (pt.after != rows[i].after || pt.prefix_len != prefix)))
            fail_msg("row %zu: %d after %lld prefix %zu", i, r, pt.after, pt.prefix_len);
        r = resume_point(&nostart[0], rows[i].req, strlen(rows[i].req), rows[i].rec, len,
                         "resp_1", &pt);
        if (r != rows[i].want_no_start)
            fail_msg("row %zu without start_query: %d", i, r);
    }
    char *url = prov_resume_url(&ps[0], "resp_1", -1);
    assert_string_equal(url, "https://example.test/t/resp_1?stream=true");
    free(url);
    assert_null(prov_resume_url(&nostart[0], "resp_1", -1));
    /* The join: the record through its last whole event, then what the resume gave; from the
     * start, what the resume gave alone. */
    static const char cut[] = CREATED("resp_1") "event: response.in_pro";
    static const char more[] = EV("response.in_progress", 1) EV("response.completed", 2);
    struct resume_point pt;
    assert_int_equal(resume_point(&ps[0], bg, strlen(bg), cut, strlen(cut), "resp_1", &pt), 1);
    size_t n = 0;
    char *joined = resume_join(cut, &pt, more, strlen(more), &n);
    static const char want[] =
        CREATED("resp_1") EV("response.in_progress", 1) EV("response.completed", 2);
    assert_int_equal(n, strlen(want));
    assert_memory_equal(joined, want, n);
    struct sse_verdict v;
    assert_int_equal(sse_read(SSE_OPENAI_RESPONSES, joined, n, &v), 0);
    assert_int_equal(v.terminal, 1);
    sse_verdict_fini(&v);
    free(joined);
    assert_int_equal(resume_point(&ps[0], bg, strlen(bg), NULL, 0, "resp_1", &pt), 1);
    joined = resume_join(NULL, &pt, want, strlen(want), &n);
    assert_int_equal(n, strlen(want));
    assert_memory_equal(joined, want, n);
    free(joined);
    prof_free_all(ps, np);
    prof_free_all(nostart, nn);
}

/* How a kept record ends: whole (concluded from it), failed (read back whole), or open. */
static void test_record_end(void **state)
{
    (void)state;
    struct cfg_provider *ps;
    size_t np;
    char err[512] = "";
    assert_int_equal(load("\"stream\":\"openai-responses\",\"reconcile\":{\"task\":{\"path\":"
                          "\"/t/{id}\"," RESUME "}}",
                          &ps, &np, err, sizeof(err)),
                     0);
#define FAILED(n)                                                                                  \
    "event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":" #n     \
    ",\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":"           \
    "\"server_error\",\"message\":\"m\"}}}\n\n"
    static const struct {
        const char *rec, *id;
        int want;
    } rows[] = {
        {TWO, "resp_1", RE_OPEN},
        {TWO EV("response.completed", 2), "resp_1", RE_WHOLE},
        {TWO EV("response.incomplete", 2), "resp_1", RE_WHOLE},
        {TWO FAILED(2), "resp_1", RE_FAILED},
        /* another generation's record: never this job's answer */
        {CREATED("resp_0") EV("response.completed", 1), "resp_1", RE_OPEN},
        /* the terminal event cut mid-way: not whole */
        {TWO "event: response.completed\ndata: {\"type\":\"response.completed\"", "resp_1",
         RE_OPEN},
        /* an error event is no terminal event: resumed (or read back) as before */
        {TWO "event: error\ndata: {\"type\":\"error\",\"code\":\"x\"}\n\n", "resp_1", RE_OPEN},
        {"", "resp_1", RE_OPEN},
        {TWO EV("response.completed", 2), "", RE_OPEN},
        {TWO EV("response.completed", 2), NULL, RE_OPEN},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        int got = resume_record_end(&ps[0], rows[i].rec, strlen(rows[i].rec), rows[i].id);
        if (got != rows[i].want)
            fail_msg("row %zu: %d, want %d", i, got, rows[i].want);
    }
    prof_free_all(ps, np);
}

/* When the bytes of a stream since its last batch are kept on the row. */
static void test_note_due(void **state)
{
    (void)state;
    static const struct {
        size_t noted, pending;
        double seconds;
        int due;
    } rows[] = {
        {0, 600, 1.0, 1},      {0, 600, 0.99, 0},       /* at most once a second */
        {0, 511, 5.0, 0},      {0, 512, 5.0, 1},        /* not for a few bytes */
        {4000, 1999, 2.0, 0},  {4000, 2000, 2.0, 1},    /* half of what is kept */
        {1 << 20, 524287, 9.0, 0}, {1 << 20, 524288, 9.0, 1},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (resume_note_due(rows[i].noted, rows[i].pending, rows[i].seconds) != rows[i].due)
            fail_msg("row %zu", i);
    /* All the writes of a stream of 16 MiB arriving in 1 KiB pieces, a second apart: each
     * append rewrites what is kept. */
    size_t noted = 0, pending = 0, written = 0, writes = 0;
    for (size_t got = 0; got < (16u << 20); got += 1024) {
        pending += 1024;
        if (resume_note_due(noted, pending, 1.0)) {
            noted += pending;
            written += noted;
            writes++;
            pending = 0;
        }
    }
    assert_true(written < 3 * (size_t)(16u << 20));
    assert_true(writes < 40);
}

/* A resume that gave no new event: tried again later (the record kept) unless the provider
 * refused it, never read back whole on a transient failure. */
static void test_a_resume_without_new_events(void **state)
{
    (void)state;
    static const struct {
        int curl, status, stream, truncated, later;
    } rows[] = {
        {28, 0, 0, 0, 1},   /* timed out */
        {56, 200, 1, 0, 1}, /* cut while receiving */
        {0, 200, 1, 0, 1},  /* a stream cut before its first new event */
        {0, 200, 0, 0, 0},  /* a 2xx that is no stream (or one with an error event) */
        {0, 408, 0, 0, 1},  {0, 425, 0, 0, 1}, {0, 429, 0, 0, 1}, {0, 500, 0, 0, 1},
        {0, 503, 0, 0, 1},
        {0, 400, 0, 0, 0},  /* refused: read back whole */
        {0, 404, 0, 0, 0},  {0, 410, 0, 0, 0}, {0, 401, 0, 0, 0},
        /* longer than max_response_bytes: it would be cut there again — read back whole */
        {0, 200, 1, 1, 0},  {23, 200, 1, 1, 0}, {56, 200, 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        print_message("row %zu\n", i);
        assert_int_equal(resume_again_later(rows[i].curl, rows[i].status, rows[i].stream,
                                            rows[i].truncated),
                         rows[i].later);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_profile_member),
        cmocka_unit_test(test_resume_point),
        cmocka_unit_test(test_record_end),
        cmocka_unit_test(test_note_due),
        cmocka_unit_test(test_a_resume_without_new_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
