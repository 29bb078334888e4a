/* Table-driven tests of `{placeholder}` templates: expansion in both escape modes, syntax errors,
 * and validation against allowed lists. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/tmpl.h"

struct var {
    const char *name;
    const char *value;
};

static const struct var vars[] = {
    {"id", "abc"},      {"model.name", "x"},  {"A_1", "v"},
    {"dots", "../etc"}, {"slash", "a/b"},     {"q", "a?b=c"},
    {"amp", "a&b;c"},   {"pct", "100%"},      {"euro", "\xe2\x82\xac"},
    {"space", "a b"},   {"plus", "a+b"},      {"unres", "AZaz09-._~"},
    {"hash", "#frag"},  {"crlf", "a\r\nb"},   {"quote", "\"'<>"},
    {"braces", "{id}"}, {"high", "\x7f\xff"}, {"dot", "."},
    {"dotdot", ".."},   {"dot3", "..."},      {"empty", ""},
};

/* Looks name up in vars, using only name_len bytes: name is not NUL-terminated. */
static const char *lookup(const char *name, size_t name_len, void *arg)
{
    size_t *calls = arg;
    if (calls)
        (*calls)++;
    assert_int_equal(name[name_len], '}');
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        if (strlen(vars[i].name) == name_len && memcmp(vars[i].name, name, name_len) == 0)
            return vars[i].value;
    }
    return NULL;
}

struct expand_case {
    const char *tmpl;
    enum tmpl_escape esc;
    const char *want; /* the expansion, or NULL when it fails */
    const char *err;  /* the exact message when it fails */
};

#define SEG TMPL_URL_SEGMENT
#define RAW TMPL_RAW

static const struct expand_case expand_cases[] = {
    /* Plain substitution. */
    {"https://api.x/v1/jobs/{id}", SEG, "https://api.x/v1/jobs/abc", NULL},
    {"/v1/{model.name}/jobs/{id}/cancel", SEG, "/v1/x/jobs/abc/cancel", NULL},
    {"{id}{id}", SEG, "abcabc", NULL},
    {"{A_1}", SEG, "v", NULL},
    {"", SEG, "", NULL},
    {"", RAW, "", NULL},
    {"no placeholders/?a=b&c#d", SEG, "no placeholders/?a=b&c#d", NULL},
    /* URL-segment escaping keeps only unreserved characters. */
    {"/files/{dots}", SEG, "/files/..%2Fetc", NULL},
    {"/files/{slash}", SEG, "/files/a%2Fb", NULL},
    {"/jobs/{q}", SEG, "/jobs/a%3Fb%3Dc", NULL},
    {"/jobs?k={amp}", SEG, "/jobs?k=a%26b%3Bc", NULL},
    {"/x/{pct}", SEG, "/x/100%25", NULL},
    {"/x/{euro}", SEG, "/x/%E2%82%AC", NULL},
    {"/x/{space}", SEG, "/x/a%20b", NULL},
    {"/x/{plus}", SEG, "/x/a%2Bb", NULL},
    {"/x/{unres}", SEG, "/x/AZaz09-._~", NULL},
    {"/x/{hash}", SEG, "/x/%23frag", NULL},
    {"/x/{crlf}", SEG, "/x/a%0D%0Ab", NULL},
    {"/x/{quote}", SEG, "/x/%22%27%3C%3E", NULL},
    {"/x/{braces}", SEG, "/x/%7Bid%7D", NULL},
    {"/x/{high}", SEG, "/x/%7F%FF", NULL},
    {"/x/{dot3}", SEG, "/x/...", NULL},
    /* Values that would be dot segments or an empty segment are refused in a URL path. */
    {"/x/{dot}", SEG, NULL,
     "placeholder 'dot' is empty, '.' or '..', which a URL path segment "
     "cannot be"},
    {"/x/{dotdot}/y", SEG, NULL,
     "placeholder 'dotdot' is empty, '.' or '..', which a URL path "
     "segment cannot be"},
    {"/x/{empty}/y", SEG, NULL,
     "placeholder 'empty' is empty, '.' or '..', which a URL path "
     "segment cannot be"},
    /* Raw mode copies values as they are. */
    {"/files/{dots}", RAW, "/files/../etc", NULL},
    {"{q}&{pct}{euro}", RAW, "a?b=c&100%\xe2\x82\xac", NULL},
    {"[{dotdot}|{empty}|{dot}]", RAW, "[..||.]", NULL},
    {"{braces}", RAW, "{id}", NULL},
    /* Doubled braces are literal braces, never placeholders. */
    {"{{", SEG, "{", NULL},
    {"}}", SEG, "}", NULL},
    {"{{id}}", SEG, "{id}", NULL},
    {"{{{id}}}", SEG, "{abc}", NULL},
    {"a{{b}}c{{", RAW, "a{b}c{", NULL},
    {"{{\"model\":\"{model.name}\",\"n\":{{}}}}", RAW, "{\"model\":\"x\",\"n\":{}}", NULL},
    /* Unknown placeholders are named; lookup is case-sensitive here. */
    {"/x/{nope}/{id}", SEG, NULL, "unknown placeholder 'nope'"},
    {"{ID}", RAW, NULL, "unknown placeholder 'ID'"},
    {"{i}", RAW, NULL, "unknown placeholder 'i'"},
    {"{idx}", RAW, NULL, "unknown placeholder 'idx'"},
    {"{model}", RAW, NULL, "unknown placeholder 'model'"},
    /* Syntax errors, with the byte offset. */
    {"{id", SEG, NULL, "unterminated '{' at offset 0"},
    {"/x/{", SEG, NULL, "unterminated '{' at offset 3"},
    {"{{{", RAW, NULL, "unterminated '{' at offset 2"},
    {"{}", SEG, NULL, "empty placeholder name at offset 0"},
    {"/x/{}/y", RAW, NULL, "empty placeholder name at offset 3"},
    {"{a b}", RAW, NULL, "invalid character in placeholder at offset 2 (write '{{' for a '{')"},
    {"{\"a\":1}", RAW, NULL, "invalid character in placeholder at offset 1 (write '{{' for a '{')"},
    {"{a-b}", RAW, NULL, "invalid character in placeholder at offset 2 (write '{{' for a '{')"},
    {"{a{b}}", RAW, NULL, "invalid character in placeholder at offset 2 (write '{{' for a '{')"},
    {"}", RAW, NULL, "unmatched '}' at offset 0 (write '}}' for a '}')"},
    {"a}b", RAW, NULL, "unmatched '}' at offset 1 (write '}}' for a '}')"},
    {"{id}}", RAW, NULL, "unmatched '}' at offset 4 (write '}}' for a '}')"},
    {"}}}", RAW, NULL, "unmatched '}' at offset 2 (write '}}' for a '}')"},
};

static void test_expand(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(expand_cases) / sizeof(expand_cases[0]); i++) {
        const struct expand_case *tc = &expand_cases[i];
        print_message("expand %s\n", tc->tmpl);
        char errbuf[160] = "";
        char *out = (char *)&out;
        int rc = tmpl_expand(tc->tmpl, tc->esc, lookup, NULL, &out, errbuf, sizeof(errbuf));
        if (tc->want) {
            assert_int_equal(rc, 0);
            assert_non_null(out);
            assert_string_equal(out, tc->want);
            free(out);
        } else {
            assert_int_equal(rc, -1);
            assert_null(out);
            assert_string_equal(errbuf, tc->err);
            /* The message is optional. */
            out = (char *)&out;
            assert_int_equal(tmpl_expand(tc->tmpl, tc->esc, lookup, NULL, &out, NULL, 0), -1);
            assert_null(out);
        }
    }
}

/* lookup runs once per placeholder occurrence and never for doubled braces. */
static void test_lookup_calls(void **state)
{
    (void)state;
    size_t calls = 0;
    char *out = NULL;
    assert_int_equal(tmpl_expand("{{id}}/{id}/{q}/{id}", SEG, lookup, &calls, &out, NULL, 0), 0);
    assert_string_equal(out, "{id}/abc/a%3Fb%3Dc/abc");
    assert_int_equal(calls, 3);
    free(out);
}

/* Many substitutions grow the output well past the template's own size. */
static void test_long_expansion(void **state)
{
    (void)state;
    enum { N = 1000 };
    char *tmpl = malloc(N * 6 + 1);
    assert_non_null(tmpl);
    for (int i = 0; i < N; i++)
        memcpy(tmpl + i * 6, "{euro}", 6);
    tmpl[N * 6] = '\0';
    char *out = NULL;
    assert_int_equal(tmpl_expand(tmpl, SEG, lookup, NULL, &out, NULL, 0), 0);
    assert_int_equal(strlen(out), N * 9);
    for (int i = 0; i < N; i++)
        assert_memory_equal(out + i * 9, "%E2%82%AC", 9);
    free(out);
    free(tmpl);
}

static void test_expand_edge_arguments(void **state)
{
    (void)state;
    char errbuf[64];
    char *out = (char *)&out;
    assert_int_equal(tmpl_expand(NULL, RAW, lookup, NULL, &out, errbuf, sizeof(errbuf)), -1);
    assert_null(out);
    assert_string_equal(errbuf, "no template");

    assert_int_equal(
        tmpl_expand("{id}", (enum tmpl_escape)7, lookup, NULL, &out, errbuf, sizeof(errbuf)), -1);
    assert_null(out);
    assert_string_equal(errbuf, "invalid escape mode 7");

    /* Without a lookup every placeholder is unknown, but plain text still expands. */
    assert_int_equal(tmpl_expand("{id}", RAW, NULL, NULL, &out, errbuf, sizeof(errbuf)), -1);
    assert_string_equal(errbuf, "unknown placeholder 'id'");
    assert_int_equal(tmpl_expand("plain {{}}", RAW, NULL, NULL, &out, NULL, 0), 0);
    assert_string_equal(out, "plain {}");
    free(out);

    /* A short errbuf truncates the message and stays NUL-terminated. */
    char small[8];
    memset(small, 'z', sizeof(small));
    assert_int_equal(tmpl_expand("{nope}", RAW, lookup, NULL, &out, small, sizeof(small)), -1);
    assert_string_equal(small, "unknown");

    /* A very long unknown name is cut in the message. */
    char tmpl[205] = "{";
    memset(tmpl + 1, 'n', 200);
    strcpy(tmpl + 201, "}");
    char big[256];
    assert_int_equal(tmpl_expand(tmpl, RAW, lookup, NULL, &out, big, sizeof(big)), -1);
    assert_int_equal(strlen(big), strlen("unknown placeholder ''") + 64);
}

static const char *const allowed_id_model[] = {"id", "model", "model.name", NULL};
static const char *const allowed_id[] = {"id", NULL};
static const char *const allowed_none[] = {NULL};

struct validate_case {
    const char *tmpl;
    const char *const *allowed;
    const char *err; /* NULL: valid */
};

static const struct validate_case validate_cases[] = {
    {"/v1/jobs/{id}", allowed_id_model, NULL},
    {"/v1/{model}/jobs/{id}", allowed_id_model, NULL},
    {"{model.name}", allowed_id_model, NULL},
    {"/v1/{model}/jobs/{id}", allowed_id, "unknown placeholder 'model'"},
    {"{i}", allowed_id, "unknown placeholder 'i'"},
    {"{idx}", allowed_id, "unknown placeholder 'idx'"},
    {"{ID}", allowed_id, "unknown placeholder 'ID'"},
    {"{model.nam}", allowed_id_model, "unknown placeholder 'model.nam'"},
    {"{id}", allowed_none, "unknown placeholder 'id'"},
    {"{id}", NULL, "unknown placeholder 'id'"},
    {"plain/path", NULL, NULL},
    {"{{x}}", allowed_none, NULL},
    {"", allowed_none, NULL},
    {"/v1/jobs/{id", allowed_id, "unterminated '{' at offset 9"},
    {"{}", allowed_id, "empty placeholder name at offset 0"},
    {"{i d}", allowed_id, "invalid character in placeholder at offset 2 (write '{{' for a '{')"},
    {"x}", allowed_id, "unmatched '}' at offset 1 (write '}}' for a '}')"},
    /* Syntax is checked in order, so an earlier unknown name is reported first. */
    {"{zz}{", allowed_id, "unknown placeholder 'zz'"},
    {NULL, allowed_id, "no template"},
};

static void test_validate(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(validate_cases) / sizeof(validate_cases[0]); i++) {
        const struct validate_case *tc = &validate_cases[i];
        print_message("validate %s\n", tc->tmpl ? tc->tmpl : "(null)");
        char errbuf[160] = "";
        int rc = tmpl_validate(tc->tmpl, tc->allowed, errbuf, sizeof(errbuf));
        if (tc->err) {
            assert_int_equal(rc, -1);
            assert_string_equal(errbuf, tc->err);
            assert_int_equal(tmpl_validate(tc->tmpl, tc->allowed, NULL, 0), -1);
        } else {
            assert_int_equal(rc, 0);
            assert_string_equal(errbuf, "");
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expand),         cmocka_unit_test(test_lookup_calls),
        cmocka_unit_test(test_long_expansion), cmocka_unit_test(test_expand_edge_arguments),
        cmocka_unit_test(test_validate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
