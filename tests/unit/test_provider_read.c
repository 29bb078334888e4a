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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_id_doc),
        cmocka_unit_test(test_server_hint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
