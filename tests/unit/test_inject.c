/* Client reference injection into the client's JSON body, table-driven. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/inject.h"
#include "idemgate/jcs.h"

#include "inject_corpus.h"

static void test_rows(void **state)
{
    (void)state;
    for (size_t i = 0; i < NROWS; i++) {
        const struct row *r = &rows[i];
        size_t len = strlen(r->in);
        char *in = heap_copy(r->in, len);
        char *out = (char *)&out;
        size_t n = 7;

        int chk = inject_check(in, len, r->field);
        int rc = inject_member(in, len, r->field, "job_1", &out, &n);
        if (chk != r->rc || rc != r->rc)
            fail_msg("row %zu (%s, %s): check %s, member %s, want %s", i, r->in,
                     r->field ? r->field : "NULL", inject_strerror(chk), inject_strerror(rc),
                     inject_strerror(r->rc));
        if (r->rc) {
            assert_null(out);
            assert_int_equal(n, 0);
            free(in);
            continue;
        }
        assert_non_null(r->want);
        if (strcmp(out, r->want))
            fail_msg("row %zu: got %s, want %s", i, out, r->want);
        assert_int_equal(n, strlen(r->want));

        /* The result is strict JSON without a repeated name (after unescaping), and the field
         * is now there. */
        char *canon = NULL;
        size_t clen = 0;
        struct jcs_error err;
        if (jcs_canonicalize(out, n, 64, &canon, &clen, &err))
            fail_msg("row %zu: result %s is not strict JSON: %s", i, out, err.what);
        free(canon);
        assert_int_equal(inject_check(out, n, r->field), INJECT_EEXISTS);
        free(out);
        free(in);
    }
}

/* Every valid input of the table is strict JSON, as the gateway stores it. */
static void test_rows_are_json(void **state)
{
    (void)state;
    for (size_t i = 0; i < NROWS; i++) {
        if (rows[i].rc != 0 && rows[i].rc != INJECT_EEXISTS && rows[i].rc != INJECT_EPARENT)
            continue;
        char *canon = NULL;
        size_t clen = 0;
        if (jcs_canonicalize(rows[i].in, strlen(rows[i].in), 64, &canon, &clen, NULL))
            fail_msg("row %zu: %s is not strict JSON", i, rows[i].in);
        free(canon);
    }
}

/* inject_check() and inject_member() agree on every input of the corpus (exact-size copies: no
 * read past the end), and a placed result is always longer than its input by the inserted text. */
static void check_agrees(const struct mutation *m, void *arg)
{
    (void)arg;
    char *out = NULL;
    size_t n = 0;
    int chk = inject_check(m->in, m->len, m->field);
    int rc = inject_member(m->in, m->len, m->field, "job_1", &out, &n);
    if (chk != rc)
        fail_msg("row %zu cut %zu pos %zu: check %s, member %s", m->row, m->cut, m->pos,
                 inject_strerror(chk), inject_strerror(rc));
    if (rc == 0) {
        assert_non_null(out);
        assert_true(n > m->len);
        assert_int_equal(out[n], '\0');
    } else {
        assert_null(out);
    }
    free(out);
}

static void test_check_agrees(void **state)
{
    (void)state;
    assert_true(corpus_each(check_agrees, NULL) > 10000);
}

/* The value is written as a JSON string whatever it holds, and is never cut short. */
static void test_value_escaped(void **state)
{
    (void)state;
    char *out = NULL;
    size_t n = 0;
    assert_int_equal(inject_member("{}", 2, "m.v", "a\"b\\c\n\x01/\xc3\xa9", &out, &n), 0);
    assert_string_equal(out, "{\"m\":{\"v\":\"a\\\"b\\\\c\\u000a\\u0001/\xc3\xa9\"}}");
    free(out);

    /* Field parts are escaped the same way. */
    assert_int_equal(inject_member("{}", 2, "a\"b", "x", &out, &n), 0);
    assert_string_equal(out, "{\"a\\\"b\":\"x\"}");
    free(out);

    /* A long webhook URL (the old code cut at 512 bytes, leaving broken JSON). */
    char url[5000];
    memcpy(url, "https://gw.example/webhooks/", 28);
    memset(url + 28, 'x', sizeof url - 29);
    url[sizeof url - 1] = '\0';
    assert_int_equal(inject_member("{\"a\":1}", 7, "webhook", url, &out, &n), 0);
    assert_int_equal(n, 7 + strlen("\"webhook\":\"\",") + strlen(url));
    assert_memory_equal(out, "{\"webhook\":\"https://gw.example/webhooks/xxx", 42);
    assert_memory_equal(out + n - 9, "x\",\"a\":1}", 9);
    char *canon = NULL;
    size_t clen;
    assert_int_equal(jcs_canonicalize(out, n, 64, &canon, &clen, NULL), 0);
    free(canon);
    free(out);

    /* A body with NUL after len, and NULL with length 0. */
    assert_int_equal(inject_member("{}\0{\"ref\":1}", 2, "ref", "v", &out, &n), 0);
    assert_string_equal(out, "{\"ref\":\"v\"}");
    free(out);
    assert_int_equal(inject_check(NULL, 0, "ref"), INJECT_ENOTOBJECT);
    assert_int_equal(inject_member(NULL, 0, "ref", "v", &out, &n), INJECT_ENOTOBJECT);
    assert_null(out);
}

/* Two placements in a row (client reference, then webhook URL), as the dispatcher does. */
static void test_twice(void **state)
{
    (void)state;
    const char *in = "{\"prompt\":\"cat\",\"metad\\u0061ta\":{\"user\":\"u1\"}}";
    char *a = NULL, *b = NULL;
    size_t an = 0, bn = 0;
    assert_int_equal(inject_member(in, strlen(in), "metadata.client_ref", "job_1", &a, &an), 0);
    assert_int_equal(inject_member(a, an, "metadata.webhook_url", "http://h/w", &b, &bn), 0);
    assert_string_equal(b, "{\"prompt\":\"cat\",\"metad\\u0061ta\":{\"webhook_url\":\"http://h/w\","
                           "\"client_ref\":\"job_1\",\"user\":\"u1\"}}");
    assert_int_equal(inject_check(b, bn, "metadata.client_ref"), INJECT_EEXISTS);
    assert_int_equal(inject_check(b, bn, "metadata.webhook_url"), INJECT_EEXISTS);
    free(a);
    free(b);
}

static void test_strerror(void **state)
{
    (void)state;
    assert_string_equal(inject_strerror(INJECT_OK), "ok");
    assert_string_equal(inject_strerror(INJECT_ENOMEM), "out_of_memory");
    assert_string_equal(inject_strerror(INJECT_ENOTOBJECT), "body_not_object");
    assert_string_equal(inject_strerror(INJECT_EEXISTS), "member_exists");
    assert_string_equal(inject_strerror(INJECT_EPARENT), "parent_not_object");
    assert_string_equal(inject_strerror(INJECT_EFIELD), "invalid_field");
    assert_string_equal(inject_strerror(INJECT_ESYNTAX), "invalid_json");
    assert_string_equal(inject_strerror(-99), "unknown_error");
    /* Every refusal is negative (callers test < 0), and the codes are distinct. */
    const int codes[] = {INJECT_ENOMEM,  INJECT_ENOTOBJECT, INJECT_EEXISTS,
                         INJECT_EPARENT, INJECT_EFIELD,     INJECT_ESYNTAX};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        assert_true(codes[i] < 0);
        for (size_t j = 0; j < i; j++)
            assert_int_not_equal(codes[i], codes[j]);
    }
}

static void test_compact(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {" { \"a\" : 1 ,\n \"b\":[ 1 , 2 ] }\t", "{\"a\":1,\"b\":[1,2]}"},
        {"{\"s\": \" keep  spaces \\\" and \\\\ \"}", "{\"s\":\" keep  spaces \\\" and \\\\ \"}"},
        {"{\"seed\": 12345678901234567890, \"x\": 1.50}",
         "{\"seed\":12345678901234567890,\"x\":1.50}"},
        {"[]", "[]"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *out = NULL;
        size_t n = 0;
        assert_int_equal(inject_compact(cases[i][0], strlen(cases[i][0]), &out, &n), 0);
        assert_string_equal(out, cases[i][1]);
        assert_int_equal(n, strlen(cases[i][1]));
        free(out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows),         cmocka_unit_test(test_rows_are_json),
        cmocka_unit_test(test_check_agrees), cmocka_unit_test(test_value_escaped),
        cmocka_unit_test(test_twice),        cmocka_unit_test(test_strerror),
        cmocka_unit_test(test_compact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
