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

struct row {
    const char *in, *field;
    int rc;           /* what inject_check() and inject_member() return */
    const char *want; /* the body with "job_1" placed, when rc is 0 */
};

static const struct row rows[] = {
    /* Placed at the top level, in an empty or a non-empty body. */
    {"{}", "ref", 0, "{\"ref\":\"job_1\"}"},
    {"{\"a\":1}", "ref", 0, "{\"ref\":\"job_1\",\"a\":1}"},
    /* A missing parent is created. */
    {"{}", "metadata.ref", 0, "{\"metadata\":{\"ref\":\"job_1\"}}"},
    {"{\"a\":1}", "metadata.ref", 0, "{\"metadata\":{\"ref\":\"job_1\"},\"a\":1}"},
    /* A parent object, empty or not, receives the member. */
    {"{\"metadata\":{}}", "metadata.ref", 0, "{\"metadata\":{\"ref\":\"job_1\"}}"},
    {"{\"metadata\":{\"x\":\"y\"},\"n\":2}", "metadata.ref", 0,
     "{\"metadata\":{\"ref\":\"job_1\",\"x\":\"y\"},\"n\":2}"},
    {"{\"n\":2,\"metadata\":{\"x\":[1,{\"y\":null}]}}", "metadata.ref", 0,
     "{\"n\":2,\"metadata\":{\"ref\":\"job_1\",\"x\":[1,{\"y\":null}]}}"},
    /* A parent name written with escapes is the same member: the reference goes inside. */
    {"{\"metad\\u0061ta\":{}}", "metadata.ref", 0, "{\"metad\\u0061ta\":{\"ref\":\"job_1\"}}"},
    {"{\"\\u006D\\u0065tadata\":{\"x\":1}}", "metadata.ref", 0,
     "{\"\\u006D\\u0065tadata\":{\"ref\":\"job_1\",\"x\":1}}"},
    {"{\"a\\/b\":{}}", "a/b.ref", 0, "{\"a\\/b\":{\"ref\":\"job_1\"}}"},
    {"{\"\\u00e9t\\u00E9\":{}}", "\xc3\xa9t\xc3\xa9.ref", 0,
     "{\"\\u00e9t\\u00E9\":{\"ref\":\"job_1\"}}"},
    {"{\"\xc3\xa9t\xc3\xa9\":{}}", "\xc3\xa9t\xc3\xa9.ref", 0,
     "{\"\xc3\xa9t\xc3\xa9\":{\"ref\":\"job_1\"}}"},
    {"{\"\\ud83d\\ude00\":{}}", "\xf0\x9f\x98\x80.ref", 0,
     "{\"\\ud83d\\ude00\":{\"ref\":\"job_1\"}}"},
    {"{\"tab\\t\":{}}", "tab\t.ref", 0, "{\"tab\\t\":{\"ref\":\"job_1\"}}"},
    /* Names that only look alike are other members: compared whole, byte for byte, with case. */
    {"{\"metadata\\u0000\":{}}", "metadata.ref", 0,
     "{\"metadata\":{\"ref\":\"job_1\"},\"metadata\\u0000\":{}}"},
    {"{\"Metadata\":{}}", "metadata.ref", 0, "{\"metadata\":{\"ref\":\"job_1\"},\"Metadata\":{}}"},
    {"{\"metadat\":1,\"metadatas\":2}", "metadata.ref", 0,
     "{\"metadata\":{\"ref\":\"job_1\"},\"metadat\":1,\"metadatas\":2}"},
    {"{\"re\":1,\"refs\":2,\"Ref\":3}", "ref", 0,
     "{\"ref\":\"job_1\",\"re\":1,\"refs\":2,\"Ref\":3}"},
    /* Members of the name nested deeper, and the name inside strings, do not count. */
    {"{\"a\":\"\\\"metadata\\\":\",\"b\":{\"metadata\":1}}", "metadata.ref", 0,
     "{\"metadata\":{\"ref\":\"job_1\"},\"a\":\"\\\"metadata\\\":\",\"b\":{\"metadata\":1}}"},
    {"{\"a\":[{\"ref\":1}],\"z\":{}}", "ref", 0,
     "{\"ref\":\"job_1\",\"a\":[{\"ref\":1}],\"z\":{}}"},
    {"{\"metadata\":{\"x\":{\"ref\":1},\"y\":[{\"ref\":2}]}}", "metadata.ref", 0,
     "{\"metadata\":{\"ref\":\"job_1\",\"x\":{\"ref\":1},\"y\":[{\"ref\":2}]}}"},
    {"{\"x\":{\"metadata\":{\"ref\":1}}}", "metadata.ref", 0,
     "{\"metadata\":{\"ref\":\"job_1\"},\"x\":{\"metadata\":{\"ref\":1}}}"},
    /* Strings holding braces, brackets, quotes, colons, commas and backslashes. */
    {"{\"s\":\"}{][\\\"\\\\\",\"t\":\"\\\\\",\"u\":\"ref\"}", "ref", 0,
     "{\"ref\":\"job_1\",\"s\":\"}{][\\\"\\\\\",\"t\":\"\\\\\",\"u\":\"ref\"}"},
    {"{\"metadata\":{\"s\":\"\\\"ref\\\":1,}\"}}", "metadata.ref", 0,
     "{\"metadata\":{\"ref\":\"job_1\",\"s\":\"\\\"ref\\\":1,}\"}}"},
    {"{\"{\":\"}\",\"[\":[\"]\"]}", "ref", 0, "{\"ref\":\"job_1\",\"{\":\"}\",\"[\":[\"]\"]}"},
    /* Whitespace between tokens, as a client sends it. */
    {" { \"a\" : 1 } \n", "ref", 0, " {\"ref\":\"job_1\", \"a\" : 1 } \n"},
    {"{ }", "ref", 0, "{\"ref\":\"job_1\" }"},
    {"\t{\r\n\"metadata\" :\n{ } }", "metadata.ref", 0,
     "\t{\r\n\"metadata\" :\n{\"ref\":\"job_1\" } }"},
    {"{ \"metadata\" : { \"x\" : 1 } , \"n\" : [ 1 , 2 ] }", "metadata.ref", 0,
     "{ \"metadata\" : {\"ref\":\"job_1\", \"x\" : 1 } , \"n\" : [ 1 , 2 ] }"},
    {"{ \"n\" : true , \"m\" : null }", "metadata.ref", 0,
     "{\"metadata\":{\"ref\":\"job_1\"}, \"n\" : true , \"m\" : null }"},
    /* Every kind of value is skipped. */
    {"{\"a\":-1.5e+3,\"b\":true,\"c\":false,\"d\":null,\"e\":\"\",\"f\":[],\"g\":{},\"h\":[[{}]]}",
     "ref", 0,
     "{\"ref\":\"job_1\",\"a\":-1.5e+3,\"b\":true,\"c\":false,\"d\":null,\"e\":\"\",\"f\":[],"
     "\"g\":{},\"h\":[[{}]]}"},

    /* The member exists, also spelt with escapes, whatever its value. */
    {"{\"ref\":\"mine\"}", "ref", INJECT_EEXISTS, NULL},
    {"{\"ref\":null}", "ref", INJECT_EEXISTS, NULL},
    {"{\"a\":1,\"ref\":{}}", "ref", INJECT_EEXISTS, NULL},
    {"{\"r\\u0065f\":1}", "ref", INJECT_EEXISTS, NULL},
    {"{\"metadata\":{\"ref\":\"mine\"}}", "metadata.ref", INJECT_EEXISTS, NULL},
    {"{\"metadata\":{\"a\":1,\"ref\":null}}", "metadata.ref", INJECT_EEXISTS, NULL},
    {"{\"metadata\":{\"client_r\\u0065f\":\"my-own\"}}", "metadata.client_ref", INJECT_EEXISTS,
     NULL},
    {"{\"metad\\u0061ta\":{\"\\u0063lient_ref\":\"x\"}}", "metadata.client_ref", INJECT_EEXISTS,
     NULL},
    {"{ \"metadata\" : { \"client_ref\" : \"x\" } }", "metadata.client_ref", INJECT_EEXISTS, NULL},
    {"{\"metadata\":1}", "metadata", INJECT_EEXISTS, NULL},

    /* The parent exists and is not an object. */
    {"{\"metadata\":null}", "metadata.ref", INJECT_EPARENT, NULL},
    {"{\"metadata\":\"text\"}", "metadata.ref", INJECT_EPARENT, NULL},
    {"{\"metadata\":\"{}\"}", "metadata.ref", INJECT_EPARENT, NULL},
    {"{\"metadata\":0}", "metadata.ref", INJECT_EPARENT, NULL},
    {"{\"metadata\":-2.5e3}", "metadata.ref", INJECT_EPARENT, NULL},
    {"{\"metadata\":[]}", "metadata.ref", INJECT_EPARENT, NULL},
    {"{\"metadata\":[{\"ref\":1}]}", "metadata.ref", INJECT_EPARENT, NULL},
    {"{\"metadata\":true}", "metadata.ref", INJECT_EPARENT, NULL},
    {"{\"metadata\":false}", "metadata.ref", INJECT_EPARENT, NULL},
    {"{ \"metadata\" : null }", "metadata.ref", INJECT_EPARENT, NULL},
    {"{\"metad\\u0061ta\":null}", "metadata.ref", INJECT_EPARENT, NULL},

    /* The body is not an object. */
    {"[1,2]", "ref", INJECT_ENOTOBJECT, NULL},
    {"[{\"metadata\":{}}]", "metadata.ref", INJECT_ENOTOBJECT, NULL},
    {" [ ] ", "ref", INJECT_ENOTOBJECT, NULL},
    {"\"{}\"", "ref", INJECT_ENOTOBJECT, NULL},
    {"1", "ref", INJECT_ENOTOBJECT, NULL},
    {"null", "metadata.ref", INJECT_ENOTOBJECT, NULL},
    {"", "ref", INJECT_ENOTOBJECT, NULL},
    {" \n ", "ref", INJECT_ENOTOBJECT, NULL},

    /* The field spec is wrong (checked first, whatever the body). */
    {"{}", "a.b.c", INJECT_EFIELD, NULL},
    {"{}", "", INJECT_EFIELD, NULL},
    {"{}", ".", INJECT_EFIELD, NULL},
    {"{}", "a.", INJECT_EFIELD, NULL},
    {"{}", ".b", INJECT_EFIELD, NULL},
    {"{}", "..", INJECT_EFIELD, NULL},
    {"{}", "a..b", INJECT_EFIELD, NULL},
    {"{}", NULL, INJECT_EFIELD, NULL},
    {"[]", "a.b.c", INJECT_EFIELD, NULL},

    /* Not well-formed JSON where it is read (the gateway only stores strict JSON), and a
     * repeated parent. */
    {"{", "ref", INJECT_ESYNTAX, NULL},
    {"{\"a\"", "ref", INJECT_ESYNTAX, NULL},
    {"{\"a\":}", "ref", INJECT_ESYNTAX, NULL},
    {"{\"a\":1,}", "ref", INJECT_ESYNTAX, NULL},
    {"{\"a\":1", "ref", INJECT_ESYNTAX, NULL},
    {"{\"a\" 1}", "ref", INJECT_ESYNTAX, NULL},
    {"{a:1}", "ref", INJECT_ESYNTAX, NULL},
    {"{} x", "ref", INJECT_ESYNTAX, NULL},
    {"{}{}", "ref", INJECT_ESYNTAX, NULL},
    {"{\"ref\":1,}", "ref", INJECT_ESYNTAX, NULL},
    {"{\"a\":[1,{\"b\":2}}", "ref", INJECT_ESYNTAX, NULL},
    {"{\"a\":\"\\x\"}", "ref", INJECT_ESYNTAX, NULL},
    {"{\"a\":\"\\u12\"}", "ref", INJECT_ESYNTAX, NULL},
    {"{\"\\ud800\":1}", "ref", INJECT_ESYNTAX, NULL},
    {"{\"\\udc00\":1}", "ref", INJECT_ESYNTAX, NULL},
    {"{\"\\ud800\\u0041\":1}", "ref", INJECT_ESYNTAX, NULL},
    {"{\"a\nb\":1}", "ref", INJECT_ESYNTAX, NULL},
    {"{\"metadata\":{},\"metadata\":{}}", "metadata.ref", INJECT_ESYNTAX, NULL},
    {"{\"metadata\":{\"a\":1,}}", "metadata.ref", INJECT_ESYNTAX, NULL},
    {"{\"metadata\":{\"a\" 1}}", "metadata.ref", INJECT_ESYNTAX, NULL},
};

#define NROWS (sizeof(rows) / sizeof(rows[0]))

/* Calls f on an exact-size heap copy of in[0..len), so that ASan sees any read past len. */
static char *heap_copy(const char *in, size_t len)
{
    char *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, in, len);
    return copy;
}

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

/* inject_check() and inject_member() agree on every prefix of every input and on every
 * single-byte change to it (exact-size copies: no read past the end), and a placed result is
 * always longer than its input by the inserted text. */
static void test_check_agrees(void **state)
{
    (void)state;
    static const char subst[] = "\"\\{}[]:, u0.\n";
    size_t tried = 0;
    for (size_t i = 0; i < NROWS; i++) {
        size_t len = strlen(rows[i].in);
        const char *field = rows[i].field;
        for (size_t cut = 0; cut <= len; cut++) {
            for (size_t pos = 0; pos <= cut; pos++) {
                for (size_t k = 0; k < (pos < cut ? sizeof subst : 1); k++) {
                    char *in = heap_copy(rows[i].in, cut);
                    if (pos < cut)
                        in[pos] = subst[k]; /* the last k is the terminating NUL: a NUL byte */
                    char *out = NULL;
                    size_t n = 0;
                    int chk = inject_check(in, cut, field);
                    int rc = inject_member(in, cut, field, "job_1", &out, &n);
                    if (chk != rc)
                        fail_msg("row %zu cut %zu pos %zu: check %s, member %s", i, cut, pos,
                                 inject_strerror(chk), inject_strerror(rc));
                    if (rc == 0) {
                        assert_non_null(out);
                        assert_true(n > cut);
                        assert_int_equal(out[n], '\0');
                    } else {
                        assert_null(out);
                    }
                    free(out);
                    free(in);
                    tried++;
                }
            }
        }
    }
    assert_true(tried > 10000);
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
