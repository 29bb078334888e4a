/* The intake's one parse of a request body (reqbody), table-driven, and a differential test
 * against what the intake did before: jcs_canonicalize, inject_compact, inject_check, and cJSON
 * with jpath_first for the requested count. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "idemgate/inject.h"
#include "idemgate/jcs.h"
#include "idemgate/jpath.h"
#include "idemgate/reqbody.h"

#include "inject_corpus.h"

#define DEPTH 64
#define DEFAULT 9 /* outputs_default in the table */

static struct jpath *compile(const char *text)
{
    struct jpath *p = NULL;
    const char *err = NULL;
    if (!text)
        return NULL;
    if (jpath_compile(text, &p, &err))
        fail_msg("path %s: %s", text, err);
    return p;
}

/* The requested count as the intake read it before: cJSON over json, then jpath_first. */
static int old_requested(const struct jpath *path, int def, const char *json, size_t len)
{
    int n = def;
    cJSON *doc = cJSON_ParseWithLength(json, len);
    const cJSON *v = jpath_first(path, doc);
    if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1000)
        n = (int)v->valuedouble;
    /* (and since then a string of digits: the number it writes) */
    if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        size_t a = strspn(s, " \t\r\n"), d = strspn(s + a, "0123456789");
        if (d && s[a + d + strspn(s + a + d, " \t\r\n")] == '\0') {
            long x = strtol(s + a, NULL, 10);
            if (x >= 1 && x <= 1000)
                n = (int)x;
        }
    }
    cJSON_Delete(doc);
    return n;
}

/* ---- The table ---- */

struct body_case {
    const char *in;
    const char *field; /* client_ref_field; NULL: not placed */
    const char *path;  /* outputs_path; NULL: none */
    int counted;
    int placeable, requested;
    const char *sent, *canon; /* NULL: not checked */
};

static const struct body_case body_cases[] = {
    /* The three forms: canonical (sorted, numbers normalised), compacted (as written). */
    {" { \"seed\" : 12345678901234567890 , \"x\" : 1.50,\"a\":\" a  b \" } ", NULL, NULL, 0,
     INJECT_OK, -1, "{\"seed\":12345678901234567890,\"x\":1.50,\"a\":\" a  b \"}",
     "{\"a\":\" a  b \",\"seed\":12345678901234567890,\"x\":1.5}"},
    {"[ 1 , {\"b\" : [ ] , \"a\" : { } } ]\n", NULL, NULL, 0, INJECT_OK, -1,
     "[1,{\"b\":[],\"a\":{}}]", "[1,{\"a\":{},\"b\":[]}]"},
    {"\"\\u00e9 \\n\"", NULL, NULL, 0, INJECT_OK, -1, "\"\\u00e9 \\n\"", "\"\xc3\xa9 \\n\""},
    /* The count: a number in 1..1000 at the path (truncated), else the default. */
    {"{\"n\":3}", NULL, "$.n", 1, INJECT_OK, 3, "{\"n\":3}", "{\"n\":3}"},
    {"{\"n\":3}", NULL, "$.n", 0, INJECT_OK, -1, NULL, NULL},
    {"{\"n\":3}", NULL, NULL, 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":3}", NULL, "$.m", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":1}", NULL, "$.n", 1, INJECT_OK, 1, NULL, NULL},
    {"{\"n\":1000}", NULL, "$.n", 1, INJECT_OK, 1000, NULL, NULL},
    {"{\"n\":1e3}", NULL, "$.n", 1, INJECT_OK, 1000, NULL, NULL},
    {"{\"n\":1.9}", NULL, "$.n", 1, INJECT_OK, 1, NULL, NULL},
    {"{\"n\":0}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":0.99}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":-1}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":1001}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":1000.0000000000001}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    /* A count written as a string is that count as APIs that coerce parameters (pydantic)
     * read it — digits, a '+', underscores between digits, a fraction of zeros ("4.0" made 4
     * outputs priced as 1); any other string is none. */
    {"{\"n\":\"5\"}", NULL, "$.n", 1, INJECT_OK, 5, NULL, NULL},
    {"{\"n\":\" 04\\t\"}", NULL, "$.n", 1, INJECT_OK, 4, NULL, NULL},
    {"{\"n\":\"1000\"}", NULL, "$.n", 1, INJECT_OK, 1000, NULL, NULL},
    {"{\"n\":\"1001\"}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":\"0\"}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":\"+4\"}", NULL, "$.n", 1, INJECT_OK, 4, NULL, NULL},
    {"{\"n\":\"4.0\"}", NULL, "$.n", 1, INJECT_OK, 4, NULL, NULL},
    {"{\"n\":\" 4.00 \"}", NULL, "$.n", 1, INJECT_OK, 4, NULL, NULL},
    {"{\"n\":\"4.\"}", NULL, "$.n", 1, INJECT_OK, 4, NULL, NULL},
    {"{\"n\":\"1_0\"}", NULL, "$.n", 1, INJECT_OK, 10, NULL, NULL},
    {"{\"n\":\"1__0\"}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":\"_1\"}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":\"1_\"}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":\".0\"}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":\"+\"}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":\"4.01\"}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":\"4.5\"}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":\"-4\"}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":\"\"}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":\"99999999999\"}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":true}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":[5]}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"{\"n\":[5]}", NULL, "$.n[0]", 1, INJECT_OK, 5, NULL, NULL},
    {"{\"n\":[5,6]}", NULL, "$.n[-1]", 1, INJECT_OK, 6, NULL, NULL},
    {"{\"o\":[{\"k\":1},{\"n\":4}]}", NULL, "$.o[*].n", 1, INJECT_OK, 4, NULL, NULL},
    {"{\"a b\":{\"c.d\":12}}", NULL, "$['a b']['c.d']", 1, INJECT_OK, 12, NULL, NULL},
    {"{\"N\":3}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    {"5", NULL, "$", 1, INJECT_OK, 5, NULL, NULL},
    /* A wildcard over an object meets its members in canonical order: "a" before "b", whatever
     * the client wrote (test_order_not_document has the old, document-order answer). */
    {"{\"items\":{\"b\":{\"n\":5},\"a\":{\"n\":7}}}", NULL, "$.items.*.n", 1, INJECT_OK, 7, NULL,
     NULL},
    {"{\"z\":2,\"y\":\"s\"}", NULL, "$.*", 1, INJECT_OK, DEFAULT, NULL, NULL},
    /* Names are decoded and whole: an escape is its character, a \u0000 is part of the name
     * (cJSON cut names at it, so "n\u0000" used to count as "n"). */
    {"{\"\\u006e\":6}", NULL, "$.n", 1, INJECT_OK, 6, NULL, NULL},
    {"{\"n\\u0000\":5}", NULL, "$.n", 1, INJECT_OK, DEFAULT, NULL, NULL},
    /* A number longer than cJSON's 63-byte buffer (cJSON refused the whole body: the default). */
    {"{\"n\":2.000000000000000000000000000000000000000000000000000000000000000000001}", NULL, "$.n",
     1, INJECT_OK, 2, NULL, NULL},
    /* Placing the client reference: inject_check's codes. */
    {"{}", "metadata.client_ref", NULL, 0, INJECT_OK, -1, NULL, NULL},
    {"{\"metadata\":{\"a\":1}}", "metadata.client_ref", NULL, 0, INJECT_OK, -1, NULL, NULL},
    {"{\"metadata\":{\"client_ref\":1}}", "metadata.client_ref", NULL, 0, INJECT_EEXISTS, -1, NULL,
     NULL},
    {"{\"metad\\u0061ta\":{\"client_r\\u0065f\":1}}", "metadata.client_ref", NULL, 0,
     INJECT_EEXISTS, -1, NULL, NULL},
    {"{\"metadata\":null}", "metadata.client_ref", NULL, 0, INJECT_EPARENT, -1, NULL, NULL},
    {"{\"metadata\":[]}", "metadata.client_ref", NULL, 0, INJECT_EPARENT, -1, NULL, NULL},
    {"{\"Metadata\":null}", "metadata.client_ref", NULL, 0, INJECT_OK, -1, NULL, NULL},
    {"{\"x\":{\"ref\":1}}", "ref", NULL, 0, INJECT_OK, -1, NULL, NULL},
    {"{\"ref\":null}", "ref", NULL, 0, INJECT_EEXISTS, -1, NULL, NULL},
    {"[{\"ref\":1}]", "ref", NULL, 0, INJECT_ENOTOBJECT, -1, NULL, NULL},
    {"\"{}\"", "ref", NULL, 0, INJECT_ENOTOBJECT, -1, NULL, NULL},
    {"{}", "a..b", NULL, 0, INJECT_EFIELD, -1, NULL, NULL},
    {"[]", "a.b.c", NULL, 0, INJECT_EFIELD, -1, NULL, NULL},
    /* All at once. */
    {"{ \"metadata\" : { \"u\" : 1 } , \"num_outputs\" : 4 }", "metadata.client_ref",
     "$.num_outputs", 1, INJECT_OK, 4, "{\"metadata\":{\"u\":1},\"num_outputs\":4}",
     "{\"metadata\":{\"u\":1},\"num_outputs\":4}"},
};

static void test_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof body_cases / sizeof body_cases[0]; i++) {
        const struct body_case *c = &body_cases[i];
        struct jpath *path = compile(c->path);
        struct reqbody_needs needs = {DEPTH, c->field, path, DEFAULT, c->counted, NULL};
        struct reqbody b;
        size_t len = strlen(c->in);
        char *in = heap_copy(c->in, len);
        int rc = reqbody_init(&b, in, len, &needs, NULL);
        if (rc)
            fail_msg("case %zu: %s", i, jcs_strerror(rc));
        if (b.placeable != c->placeable || b.requested != c->requested)
            fail_msg("case %zu: placeable %s, requested %d; want %s, %d", i,
                     inject_strerror(b.placeable), b.requested, inject_strerror(c->placeable),
                     c->requested);
        assert_int_equal(strlen(b.sent), b.sent_len);
        assert_int_equal(strlen(b.canon), b.canon_len);
        if (c->sent)
            assert_string_equal(b.sent, c->sent);
        if (c->canon)
            assert_string_equal(b.canon, c->canon);
        reqbody_fini(&b);
        assert_null(b.sent);
        assert_int_equal(b.requested, -1);
        jpath_free(path);
        free(in);
    }
}

/* Refused bodies: jcs_canonicalize's error, and no buffers. */
static void test_refused(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        int code;
        size_t offset;
    } cases[] = {
        {"", JCS_ESYNTAX, 0},
        {"{\"a\":1,\"a\":2}", JCS_EDUPKEY, 7},
        {"{\"a\":1} x", JCS_ETRAILING, 8},
        {"[[[]]]", JCS_EDEPTH, 2},
        {"{\"n\":1e999}", JCS_ENUMBER, 5},
        {"\"\xff\"", JCS_EUTF8, 1},
    };
    struct reqbody_needs needs = {2, "ref", NULL, DEFAULT, 1, NULL};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct reqbody b;
        struct jcs_error err;
        size_t len = strlen(cases[i].in);
        int rc = reqbody_init(&b, cases[i].in, len, &needs, &err);
        if (rc != cases[i].code || err.code != rc || err.offset != cases[i].offset)
            fail_msg("case %zu: %s at %zu", i, jcs_strerror(rc), err.offset);
        assert_null(b.canon);
        assert_null(b.sent);
        assert_int_equal(b.requested, -1);
        assert_int_equal(reqbody_init(&b, cases[i].in, len, &needs, NULL), cases[i].code);
        reqbody_fini(&b);
    }
    struct reqbody b;
    assert_int_equal(reqbody_init(&b, NULL, 0, &needs, NULL), JCS_ESYNTAX);
}

/* The wildcard case that differs from the old reading on purpose: document order found "b"
 * first, canonical order finds "a"; either way the count is that of a member the client sent,
 * and now two bodies with one fingerprint always ask for the same count. */
static void test_order_not_document(void **state)
{
    (void)state;
    const char *in = "{\"items\":{\"b\":{\"n\":5},\"a\":{\"n\":7}}}";
    const char *swapped = "{\"items\":{\"a\":{\"n\":7},\"b\":{\"n\":5}}}";
    struct jpath *path = compile("$.items.*.n");
    struct reqbody_needs needs = {DEPTH, NULL, path, DEFAULT, 1, NULL};
    struct reqbody b, s;
    assert_int_equal(reqbody_init(&b, in, strlen(in), &needs, NULL), 0);
    assert_int_equal(reqbody_init(&s, swapped, strlen(swapped), &needs, NULL), 0);
    assert_int_equal(old_requested(path, DEFAULT, b.sent, b.sent_len), 5);
    assert_int_equal(old_requested(path, DEFAULT, s.sent, s.sent_len), 7);
    assert_int_equal(b.requested, 7);
    assert_int_equal(s.requested, 7);
    assert_string_equal(b.canon, s.canon);
    reqbody_fini(&b);
    reqbody_fini(&s);
    jpath_free(path);
}

/* ---- The differential test over the inject corpus ---- */

static const char *const diff_paths[] = {
    "$",
    "$.n",
    "$.a",
    "$.ref",
    "$.metadata",
    "$.metadata.x",
    "$.metadata.ref",
    "$.metadata.n",
    "$['n']",
    "$.a[0]",
    "$.h[-1]",
    "$[0]",
    "$[-1]",
    "$.*",
    "$[*]",
    "$.*.*",
    "$.metadata.*",
    "$.metadata.x[*]",
    "$.*[0]",
};
#define N_PATHS (sizeof diff_paths / sizeof diff_paths[0])

struct diff {
    struct jpath *paths[N_PATHS];
    size_t accepted, counted, in_range, order_differs;
};

/* The count for path k agrees with the old reading of the canonical text (members in the order
 * the document is navigated in), and with the old reading of the client's bytes unless a
 * wildcard met an object, whose members the client may have written in another order. */
static void diff_requested(const struct mutation *m, const struct reqbody *b, struct diff *d,
                           size_t k)
{
    struct reqbody_needs needs = {DEPTH, NULL, d->paths[k], DEFAULT, 1, NULL};
    struct reqbody c;
    assert_int_equal(reqbody_init(&c, m->in, m->len, &needs, NULL), 0);
    int in_canon = old_requested(d->paths[k], DEFAULT, b->canon, b->canon_len);
    int in_sent = old_requested(d->paths[k], DEFAULT, b->sent, b->sent_len);
    if (c.requested != in_canon)
        fail_msg("row %zu cut %zu pos %zu %s: requested %d, old on canonical %d", m->row, m->cut,
                 m->pos, diff_paths[k], c.requested, in_canon);
    if (c.requested != in_sent) {
        if (!strchr(diff_paths[k], '*'))
            fail_msg("row %zu cut %zu pos %zu %s: requested %d, old %d", m->row, m->cut, m->pos,
                     diff_paths[k], c.requested, in_sent);
        d->order_differs++;
    }
    d->counted++;
    d->in_range += c.requested != DEFAULT;
    reqbody_fini(&c);
}

static void differential(const struct mutation *m, void *arg)
{
    struct diff *d = arg;
    struct reqbody_needs needs = {DEPTH, m->field, NULL, DEFAULT, 0, NULL};
    struct reqbody b;
    struct jcs_error got, want;
    char *canon = NULL, *compact = NULL;
    size_t clen = 0, n = 0;
    int rc = reqbody_init(&b, m->in, m->len, &needs, &got);
    int wrc = jcs_canonicalize(m->in, m->len, DEPTH, &canon, &clen, &want);
    if (rc != wrc || (rc && (got.offset != want.offset || strcmp(got.what, want.what))))
        fail_msg("row %zu cut %zu pos %zu: %s at %zu, jcs_canonicalize %s at %zu", m->row, m->cut,
                 m->pos, jcs_strerror(rc), got.offset, jcs_strerror(wrc), want.offset);
    if (rc)
        return;
    d->accepted++;
    assert_int_equal(b.canon_len, clen);
    assert_memory_equal(b.canon, canon, clen);
    assert_int_equal(inject_compact(m->in, m->len, &compact, &n), 0);
    assert_int_equal(b.sent_len, n);
    assert_memory_equal(b.sent, compact, n);
    int place = m->field ? inject_check(b.sent, b.sent_len, m->field) : INJECT_OK;
    if (b.placeable != place)
        fail_msg("row %zu cut %zu pos %zu: placeable %s, inject_check %s", m->row, m->cut, m->pos,
                 inject_strerror(b.placeable), inject_strerror(place));
    for (size_t k = 0; k < N_PATHS; k++)
        diff_requested(m, &b, d, k);
    free(canon);
    free(compact);
    reqbody_fini(&b);
}

/* Seeds added to the inject corpus for the count: numbers in range where the paths look, written
 * with whitespace, behind wildcards, in objects whose members are not in canonical order. */
static const char *const count_seeds[] = {
    "{ \"n\" : 3 , \"metadata\" : { \"x\" : [ 1 , 2 ] , \"n\" : 8 } }",
    "{\"items\":{\"b\":{\"n\":5},\"a\":{\"n\":7}},\"n\":[4,5]}",
    "[{\"n\":2},{\"a\":3}, 4 ,\"\\u0035\"]",
    "{\"z\":{\"ref\":1},\"h\":[[1],[2,30]],\"a\":[10,20],\"\\u006e\":6}",
};

static void test_differential(void **state)
{
    (void)state;
    struct diff d = {0};
    for (size_t k = 0; k < N_PATHS; k++)
        d.paths[k] = compile(diff_paths[k]);
    size_t tried = corpus_each(differential, &d);
    for (size_t i = 0; i < sizeof count_seeds / sizeof count_seeds[0]; i++)
        tried += corpus_mutate(NROWS + i, count_seeds[i], "metadata.client_ref", differential, &d);
    print_message("%zu inputs, %zu accepted, %zu counts compared (%zu not the default), %zu in "
                  "canonical order only\n",
                  tried, d.accepted, d.counted, d.in_range, d.order_differs);
    assert_true(tried > 250000);
    assert_true(d.accepted > 1000);
    assert_true(d.in_range > 1000);
    /* The corpus does reach the exception (e.g. $.* over {"n":2,"metadata":{...}}). */
    assert_true(d.order_differs > 0);
    for (size_t k = 0; k < N_PATHS; k++)
        jpath_free(d.paths[k]);
}

/* Delivery members are left out of the canonical form at the top level only: the same request
 * asked streamed and whole is one fingerprint; anything else still counts. */
static void test_fp_skip(void **state)
{
    (void)state;
    static const char *const skip[] = {"stream", "stream_options", NULL};
    struct reqbody_needs needs = {DEPTH, NULL, NULL, DEFAULT, 0, skip};
    static const struct {
        const char *a, *b;
        int same;
    } cases[] = {
        {"{\"model\":\"m\",\"stream\":true}", "{\"model\":\"m\"}", 1},
        {"{\"stream\":true,\"stream_options\":{\"include_usage\":true},\"model\":\"m\"}",
         "{\"model\":\"m\",\"stream\":false}", 1},
        {"{\"stream\":true}", "{}", 1},
        {"{\"model\":\"m\",\"stream\":true}", "{\"model\":\"n\",\"stream\":true}", 0},
        {"{\"x\":{\"stream\":true}}", "{\"x\":{}}", 0}, /* nested: part of the request */
        {"{\"str\\u0065am\":true,\"a\":1}", "{\"a\":1}", 1}, /* names compared decoded */
        {"[\"stream\"]", "[]", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct reqbody a, b;
        print_message("case %zu\n", i);
        assert_int_equal(reqbody_init(&a, cases[i].a, strlen(cases[i].a), &needs, NULL), 0);
        assert_int_equal(reqbody_init(&b, cases[i].b, strlen(cases[i].b), &needs, NULL), 0);
        assert_int_equal(strcmp(a.canon, b.canon) == 0, cases[i].same);
        /* What is sent is the client's own body, whole. */
        assert_int_equal(a.sent_len, strlen(cases[i].a));
        reqbody_fini(&a);
        reqbody_fini(&b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp_skip),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_order_not_document),
        cmocka_unit_test(test_differential),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
