/* The problem documents every error answer carries (problem.h): the RFC 9457 members, and the
 * OpenAI-style `error` member the SDKs read, as whole valid JSON whatever the inputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "idemgate/problem.h"

static const struct {
    int status;
    const char *type;
} type_cases[] = {
    {400, "invalid_request_error"}, {401, "authentication_error"},  {402, "insufficient_quota"},
    {403, "permission_error"},      {404, "invalid_request_error"}, {405, "invalid_request_error"},
    {409, "invalid_request_error"}, {413, "invalid_request_error"}, {414, "invalid_request_error"},
    {415, "invalid_request_error"}, {416, "invalid_request_error"}, {422, "invalid_request_error"},
    {429, "rate_limit_error"},      {499, "invalid_request_error"}, {500, "server_error"},
    {503, "server_error"},          {599, "server_error"},          {200, "server_error"},
};

static void test_error_type_by_status(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(type_cases) / sizeof(type_cases[0]); i++)
        if (strcmp(problem_error_type(type_cases[i].status), type_cases[i].type) != 0)
            fail_msg("status %d: got %s, want %s", type_cases[i].status,
                     problem_error_type(type_cases[i].status), type_cases[i].type);
}

static const char *str_at(const cJSON *o, const char *a, const char *b)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b)
        v = cJSON_GetObjectItemCaseSensitive(v, b);
    return cJSON_GetStringValue(v);
}

/* Renders p, checks the result is one whole JSON object with exactly the documented members,
 * and returns it parsed (the caller deletes it). */
static cJSON *render(const struct problem *p, char *out)
{
    size_t n = problem_render(p, out, PROBLEM_BODY_MAX);
    assert_true(n > 0 && n < PROBLEM_BODY_MAX);
    assert_int_equal(strlen(out), n);
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(out, n, &end, 0);
    if (!o)
        fail_msg("not JSON: %s", out);
    assert_ptr_equal(end, out + n); /* nothing after the document */
    assert_int_equal(cJSON_GetArraySize(o), 6);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(o, "error")), 3);
    assert_int_equal(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "status")),
                     p->status);
    return o;
}

static const struct {
    int status;
    const char *type, *title, *detail, *request_id;
    const char *want_detail, *want_message;
} doc_cases[] = {
    {422, "idempotency-key-reused", "Idempotency-Key reused with different parameters",
     "this key already belongs to another request", "req_1",
     "this key already belongs to another request",
     "Idempotency-Key reused with different parameters: this key already belongs to another "
     "request"},
    /* No detail: the title stands for both. */
    {500, "internal", "Internal error", NULL, "r", "Internal error", "Internal error"},
    /* A detail equal to the title is not said twice. */
    {404, "not-found", "Not found", "Not found", "r", "Not found", "Not found"},
    /* An empty detail stays empty in `detail`; the message is the title. */
    {401, "unauthorized", "Unauthorized", "", "r", "", "Unauthorized"},
    /* Quotes, backslashes and control bytes are escaped; UTF-8 passes; other bytes are U+FFFD. */
    {400, "invalid-json", "Invalid \"JSON\"", "a\\b\tc\nd\x01 caf\xc3\xa9 \xff\xc3(", NULL,
     "a\\b\tc\nd\x01 caf\xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd(",
     "Invalid \"JSON\": a\\b\tc\nd\x01 caf\xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd("},
    /* Surrogates and overlong forms are not UTF-8. */
    {400, "bad", "T", "\xed\xa0\x80|\xc0\xaf|\xf4\x90\x80\x80", "r",
     "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd|"
     "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd",
     "T: \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd|"
     "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
};

static void test_documents(void **state)
{
    (void)state;
    char out[PROBLEM_BODY_MAX];
    for (size_t i = 0; i < sizeof(doc_cases) / sizeof(doc_cases[0]); i++) {
        const struct problem p = {doc_cases[i].status, doc_cases[i].type, doc_cases[i].title,
                                  doc_cases[i].detail, doc_cases[i].request_id};
        cJSON *o = render(&p, out);
        char urn[128];
        snprintf(urn, sizeof(urn), "urn:idemgate:problem:%s", p.type);
        assert_string_equal(str_at(o, "type", NULL), urn);
        assert_string_equal(str_at(o, "title", NULL), p.title);
        assert_string_equal(str_at(o, "detail", NULL), doc_cases[i].want_detail);
        assert_string_equal(str_at(o, "request_id", NULL), p.request_id ? p.request_id : "");
        assert_string_equal(str_at(o, "error", "message"), doc_cases[i].want_message);
        assert_string_equal(str_at(o, "error", "type"), problem_error_type(p.status));
        assert_string_equal(str_at(o, "error", "code"), p.type);
        cJSON_Delete(o);
    }
}

/* The longest parts, all of them escapes, still make one whole document: a part is cut at a
 * character boundary, never inside an escape or a UTF-8 sequence. */
static void test_longest_parts_stay_whole(void **state)
{
    (void)state;
    static char type[1000], title[1000], detail[3000], rid[1000];
    char out[PROBLEM_BODY_MAX];
    memset(type, 'a', sizeof(type) - 1);
    for (size_t i = 0; i + 1 < sizeof(title); i++)
        title[i] = "\"\x01"[i % 2];
    for (size_t i = 0; i + 2 < sizeof(detail); i += 2) /* "é" in UTF-8 */
        memcpy(detail + i, "\xc3\xa9", 2);
    memset(rid, '\x02', sizeof(rid) - 1);
    const struct problem p = {599, type, title, detail, rid};
    cJSON *o = render(&p, out);
    const char *d = str_at(o, "detail", NULL);
    assert_true(strlen(d) > 400 && strlen(d) % 2 == 0); /* whole "é"s only */
    assert_true(strlen(str_at(o, "title", NULL)) > 40);
    assert_true(strncmp(str_at(o, "error", "message"), str_at(o, "title", NULL),
                        strlen(str_at(o, "title", NULL))) == 0);
    cJSON_Delete(o);

    /* Multi-byte characters cut at the edge: a detail of 3-byte characters. */
    for (size_t i = 0; i + 3 < sizeof(detail); i += 3)
        memcpy(detail + i, "\xe2\x82\xac", 3); /* "€" */
    o = render(&p, out);
    assert_true(strlen(str_at(o, "detail", NULL)) % 3 == 0);
    cJSON_Delete(o);
}

static void test_small_buffer_gets_nothing(void **state)
{
    (void)state;
    char out[PROBLEM_BODY_MAX - 1];
    const struct problem p = {400, "x", "X", "y", "r"};
    memset(out, 'z', sizeof(out));
    assert_int_equal(problem_render(&p, out, sizeof(out)), 0);
    assert_string_equal(out, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_type_by_status),
        cmocka_unit_test(test_documents),
        cmocka_unit_test(test_longest_parts_stay_whole),
        cmocka_unit_test(test_small_buffer_gets_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
