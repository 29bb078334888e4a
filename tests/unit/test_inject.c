/* Client reference injection into canonical JSON bodies, table-driven. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/inject.h"

struct row {
    const char *in, *field, *want; /* want NULL: refused */
};

static const struct row rows[] = {
    {"{}", "ref", "{\"ref\":\"job_1\"}"},
    {"{\"a\":1}", "ref", "{\"ref\":\"job_1\",\"a\":1}"},
    {"{\"a\":1}", "metadata.ref", "{\"metadata\":{\"ref\":\"job_1\"},\"a\":1}"},
    {"{}", "metadata.ref", "{\"metadata\":{\"ref\":\"job_1\"}}"},
    {"{\"metadata\":{}}", "metadata.ref", "{\"metadata\":{\"ref\":\"job_1\"}}"},
    {"{\"metadata\":{\"x\":\"y\"},\"n\":2}", "metadata.ref",
     "{\"metadata\":{\"ref\":\"job_1\",\"x\":\"y\"},\"n\":2}"},
    /* Members that only look like the field, inside strings or deeper objects, do not count. */
    {"{\"a\":\"\\\"metadata\\\":\",\"b\":{\"metadata\":1}}", "metadata.ref",
     "{\"metadata\":{\"ref\":\"job_1\"},\"a\":\"\\\"metadata\\\":\",\"b\":{\"metadata\":1}}"},
    {"{\"a\":[{\"ref\":1}],\"z\":{}}", "ref", "{\"ref\":\"job_1\",\"a\":[{\"ref\":1}],\"z\":{}}"},
    /* Refused: an existing member, a parent that is not an object, a non-object body. */
    {"{\"ref\":\"mine\"}", "ref", NULL},
    {"{\"metadata\":{\"ref\":\"mine\"}}", "metadata.ref", NULL},
    {"{\"metadata\":\"text\"}", "metadata.ref", NULL},
    {"[1,2]", "ref", NULL},
    {"{}", "a.b.c", NULL},
};

static void test_rows(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char *out = NULL;
        size_t n = 0;
        int rc = inject_member(rows[i].in, strlen(rows[i].in), rows[i].field, "job_1", &out, &n);
        if (!rows[i].want) {
            assert_int_equal(rc, -1);
            continue;
        }
        assert_int_equal(rc, 0);
        assert_string_equal(out, rows[i].want);
        assert_int_equal(n, strlen(rows[i].want));
        free(out);
    }
}

static void test_compact(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {" { \"a\" : 1 ,\n \"b\":[ 1 , 2 ] }\t", "{\"a\":1,\"b\":[1,2]}"},
        {"{\"s\": \" keep  spaces \\\" and \\\\ \"}", "{\"s\":\" keep  spaces \\\" and \\\\ \"}"},
        {"{\"seed\": 12345678901234567890, \"x\": 1.50}", "{\"seed\":12345678901234567890,\"x\":1.50}"},
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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rows), cmocka_unit_test(test_compact)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
