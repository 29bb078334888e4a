/* Readers of a provider's answer, as tables: exact ids (prov_id_doc, prov_read_id) and the delay
 * a create's answer asks for (attempt_server_hint_ms). Rows marked "fuzz" were found by the
 * libFuzzer harness tests/fuzz/fuzz_provider.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "idemgate/attempt.h"
#include "idemgate/jpath.h"
#include "idemgate/provider.h"

static void test_id_doc(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        int parses;
        const char *id; /* at $.id; NULL: none */
    } rows[] = {
        {"{\"id\":12345678901234567890}", 1, "12345678901234567890"},
        {"{\"id\":\"task_1\"}", 1, "task_1"},
        {"{\"id\":-0}", 1, "-0"},
        {"{\"id\":1.5}", 1, NULL},
        {"{\"id\":1e3}", 1, NULL},
        {"{\"id\":\"\"}", 1, NULL},
        {"{\"id\":7}  \n", 1, "7"},
        /* fuzz: a run of number characters that is no JSON number was quoted whole, so a body
         * that is not JSON gave the id "1-2". */
        {"{\"id\":1-2}", 0, NULL},
        {"{\"id\":--1}", 0, NULL},
        {"{\"id\":1+2}", 0, NULL},
        {"[1,2] x", 0, NULL},
        /* fuzz: an integer where a key belongs was quoted into a key, so a body that is not
         * JSON parsed. */
        {"{\"error\":{23456:10}}", 0, NULL},
        {"{1:2}", 0, NULL},
        /* raw bytes that are not UTF-8: no id (stored, the database refuses the whole write;
         * changed, it names another task) */
        {"{\"id\":\"task_\xE9\"}", 1, NULL},
        {"{\"id\":\"task_\xC3\xA9\"}", 1, "task_\xC3\xA9"},
    };
    struct jpath *path = NULL;
    assert_int_equal(jpath_compile("$.id", &path, NULL), 0);
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        cJSON *doc = prov_id_doc(rows[i].body, strlen(rows[i].body));
        if ((doc != NULL) != rows[i].parses)
            fail_msg("row %zu (%s): parses %d", i, rows[i].body, doc != NULL);
        const char *id = doc ? prov_read_id(path, doc) : NULL;
        if (rows[i].id ? !id || strcmp(id, rows[i].id) : id != NULL)
            fail_msg("row %zu (%s): id %s", i, rows[i].body, id ? id : "(none)");
        cJSON_Delete(doc);
    }
    jpath_free(path);
}

static void test_server_hint(void **state)
{
    (void)state;
    struct cfg_provider p;
    memset(&p, 0, sizeof(p)); /* no body hint */
    static const struct {
        const char *headers;
        long long want; /* -2: a delay from this host's clock, at most 60 s */
    } rows[] = {
        {"{}", -1},
        {"{\"retry-after\":\"7\"}", 7000},
        {"{\"retry-after-ms\":\"250.5\",\"retry-after\":\"7\"}", 251},
        {"{\"retry-after-ms\":\"soon\",\"retry-after\":\"7\"}", 7000},
        {"{\"retry-after\":\"Sun, 06 Nov 1994 08:49:37 GMT\","
         "\"date\":\"Sun, 06 Nov 1994 08:49:30 GMT\"}",
         7000},
        {"{\"retry-after\":\"Sun, 06 Nov 1994 08:49:37 GMT\","
         "\"date\":\"Sunday, 06-Nov-94 08:49:00 GMT\"}",
         37000},
        /* fuzz: a Date header of delay-seconds digits was read as a date in 1970, and a
         * Retry-After date of 1994 then asked for 25 years. It is ignored now (this host's
         * clock: the date is past, so no wait). */
        {"{\"retry-after\":\"Sun, 06 Nov 1994 08:49:37 GMT\",\"date\":\"5\"}", 0},
        {"{\"retry-after\":\"Sun, 06 Nov 1994 08:49:37 GMT\",\"date\":\" 5\"}", 0},
        {"{\"retry-after\":\"Sun, 06 Nov 1994 08:49:37 GMT\",\"date\":\"nonsense\"}", 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char hdrs[256];
        snprintf(hdrs, sizeof(hdrs), "%s", rows[i].headers);
        struct up_response res = {.http_status = 429, .headers_json = hdrs};
        long long got = attempt_server_hint_ms(&p, &res);
        if (got != rows[i].want)
            fail_msg("row %zu (%s): %lld, want %lld", i, rows[i].headers, got, rows[i].want);
    }
}

/* A fetched result (fal's response_url): only a 4xx that carries the profile's result.error
 * makes the task failed; every refusal that says nothing of the task is read again later. */
static void test_fetched_status(void **state)
{
    (void)state;
    struct cfg_provider p, bare;
    memset(&p, 0, sizeof(p));
    memset(&bare, 0, sizeof(bare)); /* no result.error */
    const char *why = NULL;
    assert_int_equal(jpath_compile("$.detail[0].msg", &p.result_error, &why), 0);
    static const char detail[] = "{\"detail\":[{\"msg\":\"prompt refused\"}]}";
    static const struct {
        int status, curl, truncated;
        const char *body;
        int want, want_bare;
    } rows[] = {
        {200, 0, 0, "{\"images\":[]}", TS_SUCCEEDED, TS_SUCCEEDED},
        {422, 0, 0, detail, TS_FAILED, -1},
        {400, 0, 0, detail, TS_FAILED, -1},
        {422, 0, 0, "{\"error\":\"other\"}", -1, -1},  /* no result.error there */
        {422, 0, 0, "not json", -1, -1},
        {401, 0, 0, detail, -1, -1}, /* a rotated key says nothing of the task */
        {403, 0, 0, detail, -1, -1},
        {404, 0, 0, detail, -1, -1}, /* not visible yet */
        {408, 0, 0, detail, -1, -1},
        {409, 0, 0, detail, -1, -1},
        {425, 0, 0, detail, -1, -1},
        {429, 0, 0, detail, -1, -1},
        {500, 0, 0, detail, -1, -1},
        {302, 0, 0, "", -1, -1},
        {422, 0, 1, detail, -1, -1}, /* truncated */
        {0, 28, 0, NULL, -1, -1},    /* timed out */
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char body[128] = "";
        if (rows[i].body)
            snprintf(body, sizeof(body), "%s", rows[i].body);
        struct up_response r = {.http_status = rows[i].status,
                                .curl_code = rows[i].curl,
                                .body_truncated = rows[i].truncated,
                                .body = rows[i].body ? body : NULL,
                                .body_len = strlen(body)};
        int got = prov_fetched_status(&p, &r), got_bare = prov_fetched_status(&bare, &r);
        if (got != rows[i].want || got_bare != rows[i].want_bare)
            fail_msg("row %zu (%d): %d / %d, want %d / %d", i, rows[i].status, got, got_bare,
                     rows[i].want, rows[i].want_bare);
    }
    jpath_free(p.result_error);
}

/* A secret is a header's value as it is only without control bytes: a line end (a secret made
 * from a file) would end the header block and smuggle the rest of the request. */
static void test_secret_ok(void **state)
{
    (void)state;
    static const struct {
        const char *secret;
        int ok;
    } rows[] = {
        {"sk-abc123", 1},     {"", 1},          {"tok en", 1},   {"a=b/c+d", 1},
        {"sk-abc\n", 0},      {"sk-abc\r\n", 0}, {"\nsk", 0},     {"sk\tx", 0},
        {"sk\x7f", 0},        {"sk\x01", 0},     {"\xc3\xa9", 1},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (prov_secret_ok(rows[i].secret) != rows[i].ok)
            fail_msg("row %zu", i);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_id_doc),
        cmocka_unit_test(test_server_hint),
        cmocka_unit_test(test_fetched_status),
        cmocka_unit_test(test_secret_ok),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
