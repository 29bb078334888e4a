/* Loading a provider profile: fields the libFuzzer harness tests/fuzz/fuzz_profile.c found
 * accepted when they should not be. Integer fields arrive as JSON doubles: a value far outside a
 * field's bounds is refused, never wrapped into them (1e300 converted to a long is undefined
 * behaviour). A base URL needs a host, and loses every trailing '/'. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/jpath.h"
#include "idemgate/profile.h"

/* Loads one inline provider with base_url and the "retry" member retry_json; returns
 * prof_load_all's answer, with the provider's max_attempts and base URL (in url, urllen bytes) when
 * it loaded, and checks that a refusal names the field (want_field). */
static int load(const char *base_url, const char *retry_json, const char *want_field,
                int *max_attempts, char *url, size_t urllen)
{
    char text[512];
    snprintf(text, sizeof(text),
             "[{\"name\":\"p\",\"base_url\":\"%s\",\"routes\":[{\"route\":\"r\",\"method\":"
             "\"POST\",\"path\":\"/r\"}],\"retry\":%s}]",
             base_url, retry_json);
    cJSON *arr = cJSON_Parse(text);
    assert_non_null(arr);
    struct cfg_provider *ps = NULL;
    size_t n = 0;
    char err[512] = "";
    int rc = prof_load_all(arr, "t.json", ".", &ps, &n, err, sizeof(err));
    if (rc == 0) {
        *max_attempts = ps[0].max_attempts;
        snprintf(url, urllen, "%s", ps[0].base_url);
    } else {
        assert_non_null(strstr(err, want_field));
    }
    if (ps)
        prof_free_all(ps, n);
    cJSON_Delete(arr);
    return rc;
}

/* A status read by its HTTP status alone (status.by_http_status): 200 done, 202 running, a 4xx
 * about the task itself failed; a refusal that says nothing of the task is read again later. */
static void test_status_by_http(void **state)
{
    (void)state;
    static const struct {
        int http, want;
    } rows[] = {{200, TS_SUCCEEDED}, {202, TS_RUNNING}, {400, TS_FAILED}, {422, TS_FAILED},
                {410, TS_FAILED},    {401, -1},         {403, -1},        {404, -1},
                {408, -1},           {409, -1},         {425, -1},        {429, -1},
                {500, -1},           {503, -1},         {204, -1},        {302, -1}};
    struct cfg_provider p;
    memset(&p, 0, sizeof(p));
    p.status_by_http = 1;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (prof_task_status(&p, rows[i].http, NULL) != rows[i].want)
            fail_msg("HTTP %d: %d, want %d", rows[i].http, prof_task_status(&p, rows[i].http, NULL),
                     rows[i].want);
}

/* Whose requests have their outputs counted: a profile that reads them where a result holds
 * them, synchronously (outputs.received) or at a finished task (result.outputs, async only, with
 * outputs.requested). An async profile's outputs.received alone counts too; nothing else does. */
static void test_counts_outputs(void **state)
{
    (void)state;
    struct jpath *some = (struct jpath *)&some; /* any non-NULL path: only its presence is read */
    static const struct {
        enum cfg_mode mode;
        int received, result_outputs, requested, want;
    } rows[] = {{CFG_MODE_SYNC, 1, 0, 0, 1},       {CFG_MODE_SYNC, 0, 0, 1, 0},
                {CFG_MODE_SYNC, 0, 1, 1, 0},       {CFG_MODE_ASYNC_POLL, 0, 1, 1, 1},
                {CFG_MODE_ASYNC_POLL, 0, 1, 0, 0}, {CFG_MODE_ASYNC_POLL, 0, 0, 1, 0},
                {CFG_MODE_ASYNC_POLL, 1, 0, 0, 1}};
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        struct cfg_provider p;
        memset(&p, 0, sizeof(p));
        p.mode = rows[i].mode;
        p.outputs_received = rows[i].received ? some : NULL;
        p.result_outputs = rows[i].result_outputs ? some : NULL;
        p.outputs_requested = rows[i].requested ? some : NULL;
        if (prof_counts_outputs(&p) != rows[i].want)
            fail_msg("row %zu: %d, want %d", i, prof_counts_outputs(&p), rows[i].want);
    }
}

static void test_retry_numbers(void **state)
{
    (void)state;
    static const struct {
        const char *retry;
        int ok, max_attempts;
    } rows[] = {
        {"{\"max_attempts\":7}", 1, 7},
        {"{\"max_attempts\":1000}", 1, 1000},
        {"{\"max_attempts\":1001}", 0, 0},
        /* 2^32 + 5 was converted to an int as 5, inside the bounds. */
        {"{\"max_attempts\":4294967301}", 0, 0},
        {"{\"max_attempts\":-4294967295}", 0, 0},
        {"{\"max_attempts\":1e300}", 0, 0},
        {"{\"max_attempts\":1e999}", 0, 0},
        {"{\"deadline_seconds\":1e300}", 1, 5},
        {"{\"deadline_seconds\":-1e300}", 0, 0},
        {"{\"base_ms\":1e300}", 0, 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        int got = -1;
        char url[64];
        int rc = load("https://example.test", rows[i].retry, "providers.p.retry", &got, url,
                      sizeof(url));
        if ((rc == 0) != rows[i].ok || (rc == 0 && got != rows[i].max_attempts))
            fail_msg("row %zu (%s): rc %d, max_attempts %d", i, rows[i].retry, rc, got);
    }
}

static void test_base_url(void **state)
{
    (void)state;
    static const struct {
        const char *base_url;
        const char *want; /* NULL: refused */
    } rows[] = {
        {"https://api.example.test", "https://api.example.test"},
        {"http://127.0.0.1:9090/", "http://127.0.0.1:9090"},
        {"https://h.test/v1//", "https://h.test/v1"},
        {"http://", NULL},
        {"https://", NULL},
        {"http:///path", NULL},
        {"ftp://h.test", NULL},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        int attempts;
        char url[64] = "";
        int rc = load(rows[i].base_url, "{}", "providers.p.base_url", &attempts, url, sizeof(url));
        if (rows[i].want ? rc != 0 || strcmp(url, rows[i].want) : rc == 0)
            fail_msg("row %zu (%s): rc %d, url %s", i, rows[i].base_url, rc, url);
    }
}

/* auth.trip_markers (issue 21 §5): strings the refusal's body must carry for a trip status other
 * than 401 to trip the credential; validated like the other members. */
static void test_trip_markers(void **state)
{
    (void)state;
    static const struct {
        const char *auth;
        int ok, n;
    } rows[] = {
        {"{}", 1, 0},
        {"{\"trip_markers\":[]}", 1, 0},
        {"{\"trip_markers\":[\"insufficient_quota\",\"account_deactivated\"]}", 1, 2},
        {"{\"trip_markers\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\"]}", 1, 8},
        {"{\"trip_markers\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}", 0, 0},
        {"{\"trip_markers\":[\"\"]}", 0, 0},
        {"{\"trip_markers\":[403]}", 0, 0},
        {"{\"trip_markers\":\"insufficient_quota\"}", 0, 0},
        {"{\"trip_markers\":[\"line\\nbreak\"]}", 0, 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char text[512];
        snprintf(text, sizeof(text),
                 "[{\"name\":\"p\",\"base_url\":\"https://example.test\",\"routes\":[{\"route\":"
                 "\"r\",\"method\":\"POST\",\"path\":\"/r\"}],\"auth\":%s}]",
                 rows[i].auth);
        cJSON *arr = cJSON_Parse(text);
        assert_non_null(arr);
        /* An auth object needs its secret's variable: add it unless the row is about it. */
        cJSON *auth = cJSON_GetObjectItem(cJSON_GetArrayItem(arr, 0), "auth");
        cJSON_AddStringToObject(auth, "secret_env", "P_KEY");
        struct cfg_provider *ps = NULL;
        size_t n = 0;
        char err[512] = "";
        int rc = prof_load_all(arr, "t.json", ".", &ps, &n, err, sizeof(err));
        if ((rc == 0) != rows[i].ok || (rc == 0 && ps[0].n_trip_markers != rows[i].n) ||
            (rc != 0 && !strstr(err, "providers.p.auth.trip_markers")))
            fail_msg("row %zu (%s): rc %d, err %s", i, rows[i].auth, rc, err);
        if (ps)
            prof_free_all(ps, n);
        cJSON_Delete(arr);
    }
}

/* reconcile.found_status (issue 25): a synchronous provider's found task says how far it got;
 * only with a task path to read it by, never on an async profile (its "status" says that), and
 * its map's targets are the task statuses. A task's client_ref is required only where webhooks
 * may name a task. */
/* Loads one inline provider with the extra members `extra` (JSON, after a comma): prof_load_all's
 * answer, its providers in *ps (*n) and its refusal in err; *arr is the parsed document. The
 * caller frees both. */
static int load_with(const char *extra, cJSON **arr, struct cfg_provider **ps, size_t *n,
                     char *err, size_t errlen)
{
    char text[1024];
    snprintf(text, sizeof(text),
             "[{\"name\":\"p\",\"base_url\":\"https://example.test\",\"routes\":[{\"route\":"
             "\"r\",\"method\":\"POST\",\"path\":\"/r\"}],%s}]",
             extra);
    *arr = cJSON_Parse(text);
    assert_non_null(*arr);
    return prof_load_all(*arr, "t.json", ".", ps, n, err, errlen);
}

static void test_found_status(void **state)
{
    (void)state;
#define FS "\"found_status\":{\"path\":\"$.status\",\"map\":{\"done\":\"succeeded\"}}"
#define TASK "\"task\":{\"path\":\"/t/{id}\"}"
    static const struct {
        const char *extra; /* members after the routes */
        int ok;
        const char *want_err;
    } rows[] = {
        {"\"reconcile\":{" TASK "," FS "}", 1, NULL},
        {"\"reconcile\":{" TASK "}", 1, NULL},
        {"\"reconcile\":{" FS "}", 0, "reconcile.found_status"},
        {"\"reconcile\":{" TASK ",\"found_status\":{\"path\":\"$.status\",\"map\":{\"done\":"
         "\"finished\"}}}",
         0, "status.map"},
        {"\"reconcile\":{" TASK ",\"found_status\":{\"map\":{\"done\":\"succeeded\"}}}", 0,
         "found_status.path is required"},
        {"\"reconcile\":{" TASK "},\"webhook\":{\"verify\":\"standard_webhooks\",\"secret_env\":"
         "\"W\",\"event_id\":\"header:webhook-id\",\"task_id\":\"$.id\"}",
         0, "reconcile.task.client_ref is required"},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        cJSON *arr = NULL;
        struct cfg_provider *ps = NULL;
        size_t n = 0;
        char err[512] = "";
        int rc = load_with(rows[i].extra, &arr, &ps, &n, err, sizeof(err));
        if ((rc == 0) != rows[i].ok || (rc != 0 && !strstr(err, rows[i].want_err)))
            fail_msg("row %zu: rc %d, err %s", i, rc, err);
        if (rc == 0 && i == 0 && (!ps[0].status_path || prof_map_status(&ps[0], "done") != TS_SUCCEEDED))
            fail_msg("row %zu: the map was not loaded", i);
        if (ps)
            prof_free_all(ps, n);
        cJSON_Delete(arr);
    }
}

/* auth: the secret's variable (secret_env) or its file (secret_file, an absolute path), exactly
 * one; the credential every job keeps names which (secrets.h). */
static void test_auth_credential(void **state)
{
    (void)state;
    static const struct {
        const char *extra;
        const char *want; /* the credential, or NULL: refused */
        const char *want_err;
    } rows[] = {
        {"\"auth\":{\"secret_env\":\"P_KEY\"}", "P_KEY", NULL},
        {"\"auth\":{\"secret_file\":\"/run/idemgate/p-token\"}", "file:/run/idemgate/p-token",
         NULL},
        {"\"auth\":{\"secret_env\":\"P_KEY\",\"secret_file\":\"/run/t\"}", NULL,
         "exactly one of secret_env and secret_file"},
        {"\"auth\":{}", NULL, "exactly one of secret_env and secret_file"},
        {"\"auth\":{\"secret_file\":\"run/t\"}", NULL, "auth.secret_file: an absolute path"},
        {"\"auth\":{\"secret_file\":7}", NULL, "auth.secret_file: an absolute path"},
        {"\"auth\":{\"secret_env\":\"\"}", NULL, "auth.secret_env: an environment variable"},
        {"\"auth\":{\"secret_env\":\"file:/run/t\"}", NULL,
         "auth.secret_env: an environment variable"},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        cJSON *arr = NULL;
        struct cfg_provider *ps = NULL;
        size_t n = 0;
        char err[512] = "";
        int rc = load_with(rows[i].extra, &arr, &ps, &n, err, sizeof(err));
        if ((rc == 0) != (rows[i].want != NULL) ||
            (rc == 0 && strcmp(ps[0].credential, rows[i].want) != 0) ||
            (rc != 0 && !strstr(err, rows[i].want_err)))
            fail_msg("row %zu: rc %d, credential %s, err %s", i, rc,
                     rc == 0 ? ps[0].credential : "-", err);
        if (ps)
            prof_free_all(ps, n);
        cJSON_Delete(arr);
    }
}

/* reconcile.list: the items are an array's elements (a page without the array proves nothing),
 * and the list says how it is paged — next_cursor, or single_page — since a paginated list read
 * as one page would prove absence from its first page. */
static void test_list_match(void **state)
{
    (void)state;
#define LM(members)                                                                             \
    "\"client_ref\":{\"header\":\"X-Ref\"},\"reconcile\":{\"strategy\":\"list_match\","          \
    "\"list\":{\"path\":\"/l?s={since}&u={until}\",\"match\":\"$.ref\"," members "}}"
    static const struct {
        const char *extra;
        int ok, single;
        const char *want_err;
    } rows[] = {
        {LM("\"items\":\"$.data[*]\",\"next_cursor\":\"$.next\""), 1, 0, NULL},
        {LM("\"items\":\"$.a.b[*]\",\"single_page\":true"), 1, 1, NULL},
        {LM("\"items\":\"$.data[*]\""), 0, 0, "either next_cursor"},
        {LM("\"items\":\"$.data[*]\",\"single_page\":false"), 0, 0, "either next_cursor"},
        {LM("\"items\":\"$.data[*]\",\"next_cursor\":\"$.n\",\"single_page\":true"), 0, 0,
         "either next_cursor"},
        {LM("\"items\":\"$.data[*]\",\"single_page\":1"), 0, 0, "either next_cursor"},
        {LM("\"items\":\"$.data\",\"next_cursor\":\"$.next\""), 0, 0, "list.items"},
        {LM("\"items\":\"$[*]\",\"next_cursor\":\"$.next\""), 1, 0, NULL}, /* a top-level array */
        {LM("\"items\":\"[*]\",\"next_cursor\":\"$.next\""), 0, 0, "list.items"},
        {LM("\"items\":\"$.data[*].task\",\"next_cursor\":\"$.next\""), 0, 0, "list.items"},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        cJSON *arr = NULL;
        struct cfg_provider *ps = NULL;
        size_t n = 0;
        char err[512] = "";
        int rc = load_with(rows[i].extra, &arr, &ps, &n, err, sizeof(err));
        if ((rc == 0) != rows[i].ok || (rc != 0 && !strstr(err, rows[i].want_err)))
            fail_msg("row %zu: rc %d, err %s", i, rc, err);
        if (rc == 0 && (!ps[0].list_array || ps[0].list_single_page != rows[i].single))
            fail_msg("row %zu: the list was not loaded as written", i);
        if (ps)
            prof_free_all(ps, n);
        cJSON_Delete(arr);
    }
}

/* One inline provider with the extra members `extra` (JSON, after a comma): 0 and the loaded
 * provider's keep-alive and CA file (ca, calen bytes), or -1 with err naming the refusal. */
static int load_extra(const char *extra, long *keepalive, char *ca, size_t calen, char *err,
                      size_t errlen)
{
    char text[768];
    snprintf(text, sizeof(text),
             "[{\"name\":\"p\",\"base_url\":\"https://api.example\",\"routes\":[{\"route\":"
             "\"r\",\"method\":\"POST\",\"path\":\"/r\"}],%s}]",
             extra);
    cJSON *arr = cJSON_Parse(text);
    assert_non_null(arr);
    struct cfg_provider *ps = NULL;
    size_t n = 0;
    err[0] = '\0';
    int rc = prof_load_all(arr, "t.json", ".", &ps, &n, err, errlen);
    if (rc == 0) {
        *keepalive = ps[0].keepalive_seconds;
        snprintf(ca, calen, "%s", ps[0].ca_file ? ps[0].ca_file : "");
    }
    if (ps)
        prof_free_all(ps, n);
    cJSON_Delete(arr);
    return rc;
}

/* Through an https:// proxy no connection is kept (the proxy's TLS session may hold bytes no
 * check can see); an http:// proxy or none keeps them. A CA file must be an absolute path to a
 * readable file. */
static void test_keepalive_and_tls(void **state)
{
    (void)state;
    static const struct {
        const char *extra;
        int ok;
        long keepalive;
        const char *ca, *want_err;
    } rows[] = {
        {"\"timeouts\":{\"keepalive_seconds\":30}", 1, 30, "", NULL},
        {"\"timeouts\":{\"keepalive_seconds\":30},\"proxy\":\"http://px:3128\"", 1, 30, "",
         NULL},
        {"\"timeouts\":{\"keepalive_seconds\":30},\"proxy\":\"https://px:3129\"", 1, 0, "",
         NULL},
        {"\"proxy\":\"https://px:3129\"", 1, 0, "", NULL},
        {"\"tls\":{\"ca_file\":\"/dev/null\"}", 1, 2, "/dev/null", NULL},
        {"\"tls\":{\"ca_file\":\"ca.pem\"}", 0, 0, "", "tls.ca_file"},
        {"\"tls\":{\"ca_file\":\"/nonexistent/ca.pem\"}", 0, 0, "", "tls.ca_file"},
        {"\"tls\":{\"ca_file\":7}", 0, 0, "", "tls.ca_file"},
        {"\"tls\":{\"ca\":\"/dev/null\"}", 0, 0, "", "tls.ca"},
        /* a result PostgreSQL can hold in one field (1 GB) and answer in hex */
        {"\"max_response_bytes\":402653184", 1, 2, "", NULL},
        {"\"max_response_bytes\":402653185", 0, 0, "", "max_response_bytes"},
        {"\"max_response_bytes\":4294967296", 0, 0, "", "max_response_bytes"},
        {"\"max_response_bytes\":1023", 0, 0, "", "max_response_bytes"},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        long keepalive = -1;
        char ca[64] = "", err[512];
        int rc = load_extra(rows[i].extra, &keepalive, ca, sizeof(ca), err, sizeof(err));
        if ((rc == 0) != rows[i].ok || (rc != 0 && !strstr(err, rows[i].want_err)))
            fail_msg("row %zu: rc %d, err %s", i, rc, err);
        if (rc == 0 && (keepalive != rows[i].keepalive || strcmp(ca, rows[i].ca) != 0))
            fail_msg("row %zu: keepalive %ld, ca '%s'", i, keepalive, ca);
    }
}

/* The outputs a finished task's answer says the provider withheld (result.filtered) when it
 * returned none: a whole number from 1, else 0 — a profile without the member, an answer without
 * it, a value that is not such a number (a string, a fraction, a negative, a boolean, an absurd
 * size), an answer holding anything at result.outputs (a video the profile cannot read is not a
 * withheld one), or fewer withheld than the request asked for. */
static void test_outputs_withheld(void **state)
{
    (void)state;
    static const struct {
        const char *doc;
        int requested;
        long want;
    } rows[] = {
        {"{\"response\":{\"raiMediaFilteredCount\":2,\"videos\":[]}}", -1, 2},
        {"{\"response\":{\"raiMediaFilteredCount\":1}}", -1, 1},
        {"{\"response\":{\"raiMediaFilteredCount\":0}}", -1, 0},
        {"{\"response\":{\"videos\":[]}}", -1, 0},
        {"{\"response\":{\"raiMediaFilteredCount\":\"2\"}}", -1, 0},
        {"{\"response\":{\"raiMediaFilteredCount\":1.5}}", -1, 0},
        {"{\"response\":{\"raiMediaFilteredCount\":-1}}", -1, 0},
        {"{\"response\":{\"raiMediaFilteredCount\":true}}", -1, 0},
        {"{\"response\":{\"raiMediaFilteredCount\":1e300}}", -1, 0},
        {"{\"response\":{\"raiMediaFilteredCount\":1000000}}", -1, 1000000},
        {"[1]", -1, 0},
        /* one video in a shape the profile cannot read, one withheld: not "all withheld" */
        {"{\"response\":{\"raiMediaFilteredCount\":1,\"videos\":[{\"uri\":\"x\"}]}}", -1, 0},
        {"{\"response\":{\"raiMediaFilteredCount\":1,\"videos\":[null]}}", -1, 0},
        /* four asked for, one withheld, none returned: three unaccounted for */
        {"{\"response\":{\"raiMediaFilteredCount\":1,\"videos\":[]}}", 4, 0},
        {"{\"response\":{\"raiMediaFilteredCount\":4,\"videos\":[]}}", 4, 4},
        {"{\"response\":{\"raiMediaFilteredCount\":2,\"videos\":[]}}", 0, 2},
    };
    struct cfg_provider p;
    memset(&p, 0, sizeof(p));
    assert_int_equal(prof_outputs_withheld(&p, NULL, -1), 0);
    cJSON *doc = cJSON_Parse(rows[0].doc);
    assert_int_equal(prof_outputs_withheld(&p, doc, -1), 0); /* no result.filtered */
    cJSON_Delete(doc);
    assert_int_equal(jpath_compile("$.response.raiMediaFilteredCount", &p.result_filtered, NULL),
                     0);
    assert_int_equal(jpath_compile("$.response.videos[*]", &p.result_outputs, NULL), 0);
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        doc = cJSON_Parse(rows[i].doc);
        assert_non_null(doc);
        long got = prof_outputs_withheld(&p, doc, rows[i].requested);
        if (got != rows[i].want)
            fail_msg("%s (%d asked): %ld, want %ld", rows[i].doc, rows[i].requested, got,
                     rows[i].want);
        cJSON_Delete(doc);
    }
    jpath_free(p.result_filtered);
    jpath_free(p.result_outputs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_by_http),
        cmocka_unit_test(test_counts_outputs),
        cmocka_unit_test(test_retry_numbers),
        cmocka_unit_test(test_base_url),
        cmocka_unit_test(test_trip_markers),
        cmocka_unit_test(test_found_status),
        cmocka_unit_test(test_auth_credential),
        cmocka_unit_test(test_list_match),
        cmocka_unit_test(test_keepalive_and_tls),
        cmocka_unit_test(test_outputs_withheld),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
