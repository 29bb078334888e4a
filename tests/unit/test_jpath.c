/* Table-driven tests of the JSONPath subset: each row is a document, a path, and the selected
 * values serialised as one JSON array (or the exact compile error). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/jcs.h"
#include "idemgate/jpath.h"
#include "idemgate/reqbody.h"

/* A provider-shaped response used by most rows. */
static const char *const DOC =
    "{\"id\":\"gen_1\",\"ID\":\"upper\","
    "\"urls\":{\"get\":\"https://x/1\",\"cancel\":\"https://x/1/c\"},"
    "\"data\":[{\"url\":\"u0\"},{\"url\":\"u1\",\"x\":1},{\"nourl\":true},{\"url\":\"u3\"}],"
    "\"output\":[\"o0\",\"o1\",\"o2\"],"
    "\"assets\":{\"video\":\"v.mp4\",\"thumb\":\"t.jpg\"},"
    "\"response\":{\"videos\":[{\"gcsUri\":\"gs://a\"},{\"gcsUri\":\"gs://b\"}]},"
    "\"a b\":{\"c.d\":5},\"it's\":1,\"back\\\\slash\":2,\"q\\\"uote\":3,\"n\":7,\"nil\":null,"
    "\"empty\":[],\"eo\":{},\"nested\":[[1,2],[3],[]],"
    "\"a\":[{\"b\":[{\"c\":1},{\"c\":2}]},{\"b\":[]},{\"b\":[{\"c\":3},{\"d\":4}]},"
    "{\"b\":{\"k\":{\"c\":5},\"l\":{\"c\":6}}},{\"b\":\"s\"}]}";

struct select_case {
    const char *doc; /* NULL: DOC */
    const char *path;
    const char *want; /* the selected values, serialised as a JSON array */
};

static const struct select_case select_cases[] = {
    /* Root. */
    {"{\"a\":1}", "$", "[{\"a\":1}]"},
    {"\"str\"", "$", "[\"str\"]"},
    {"null", "$", "[null]"},
    /* Members. */
    {NULL, "$.id", "[\"gen_1\"]"},
    {NULL, "$.urls.get", "[\"https://x/1\"]"},
    {NULL, "$.assets.video", "[\"v.mp4\"]"},
    {NULL, "$.n", "[7]"},
    {NULL, "$.nil", "[null]"},
    {NULL, "$.missing", "[]"},
    {NULL, "$.urls.missing", "[]"},
    {NULL, "$.missing.deeper", "[]"},
    {"{\"x-y_1\":1,\"0\":2}", "$.x-y_1", "[1]"},
    {"{\"x-y_1\":1,\"0\":2}", "$.0", "[2]"},
    /* Case sensitivity: "ID" and "id" are different members. */
    {NULL, "$.ID", "[\"upper\"]"},
    {"{\"id\":1}", "$.ID", "[]"},
    {"{\"id\":1}", "$.Id", "[]"},
    {"{\"Urls\":{\"Get\":1}}", "$.urls.get", "[]"},
    /* Bracket-quoted names. */
    {NULL, "$['id']", "[\"gen_1\"]"},
    {NULL, "$[\"id\"]", "[\"gen_1\"]"},
    {NULL, "$['a b']['c.d']", "[5]"},
    {NULL, "$[\"a b\"].c", "[]"},
    {NULL, "$['it\\'s']", "[1]"},
    {NULL, "$[\"it's\"]", "[1]"},
    {NULL, "$['back\\\\slash']", "[2]"},
    {NULL, "$['q\"uote']", "[3]"},
    {NULL, "$[\"q\\\"uote\"]", "[3]"},
    {NULL, "$['urls'].get", "[\"https://x/1\"]"},
    {"{\"caf\xc3\xa9\":1}", "$['caf\xc3\xa9']", "[1]"},
    /* Indices. */
    {NULL, "$.output[0]", "[\"o0\"]"},
    {NULL, "$.output[2]", "[\"o2\"]"},
    {NULL, "$.output[3]", "[]"},
    {NULL, "$.output[2147483647]", "[]"},
    {NULL, "$.output[-1]", "[\"o2\"]"},
    {NULL, "$.output[-3]", "[\"o0\"]"},
    {NULL, "$.output[-4]", "[]"},
    {NULL, "$.output[-2147483647]", "[]"},
    {NULL, "$.empty[0]", "[]"},
    {NULL, "$.empty[-1]", "[]"},
    {NULL, "$.nested[0][1]", "[2]"},
    {NULL, "$.data[1].url", "[\"u1\"]"},
    {NULL, "$.data[2].url", "[]"},
    {"[10,20]", "$[0]", "[10]"},
    {"[10,20]", "$[-1]", "[20]"},
    /* Wildcards over arrays and objects, in document order. */
    {NULL, "$.data[*].url", "[\"u0\",\"u1\",\"u3\"]"},
    {NULL, "$.response.videos[*].gcsUri", "[\"gs://a\",\"gs://b\"]"},
    {NULL, "$.output[*]", "[\"o0\",\"o1\",\"o2\"]"},
    {NULL, "$.assets[*]", "[\"v.mp4\",\"t.jpg\"]"},
    {NULL, "$.assets.*", "[\"v.mp4\",\"t.jpg\"]"},
    {NULL, "$.urls.*", "[\"https://x/1\",\"https://x/1/c\"]"},
    {NULL, "$.empty[*]", "[]"},
    {NULL, "$.eo[*]", "[]"},
    {NULL, "$.id[*]", "[]"},
    {NULL, "$.n.*", "[]"},
    {"[1,\"x\",null,true,{\"k\":[]}]", "$[*]", "[1,\"x\",null,true,{\"k\":[]}]"},
    {"{\"a\":1,\"a\":2}", "$[*]", "[1,2]"},
    {"{\"a\":1,\"a\":2}", "$.a", "[1]"},
    /* Nested wildcards, also through objects and past non-containers. */
    {NULL, "$.nested[*][*]", "[1,2,3]"},
    {NULL, "$.nested[*][0]", "[1,3]"},
    {NULL, "$.nested[*][-1]", "[2,3]"},
    {NULL, "$.a[*].b[*].c", "[1,2,3,5,6]"},
    {NULL, "$.a[*].b[0].c", "[1,3]"},
    {NULL, "$.a[*].b.k.c", "[5]"},
    {NULL, "$.a.*.b.*.*", "[1,2,3,4,5,6]"},
    /* Type mismatches select nothing. */
    {NULL, "$.urls[0]", "[]"},
    {NULL, "$.urls[-1]", "[]"},
    {NULL, "$.output.length", "[]"},
    {NULL, "$.output['0']", "[]"},
    {NULL, "$.id.x", "[]"},
    {NULL, "$.id[0]", "[]"},
    {NULL, "$.nil.x", "[]"},
    {NULL, "$.n[0]", "[]"},
    {"\"str\"", "$.a", "[]"},
    {"[{\"a\":1}]", "$.a", "[]"},
};

struct collect {
    char buf[512];
    size_t len;
    size_t calls;
    const cJSON *first;
};

static void collect_cb(const cJSON *node, void *arg)
{
    struct collect *c = arg;
    char *s = cJSON_PrintUnformatted(node);
    assert_non_null(s);
    int n = snprintf(c->buf + c->len, sizeof(c->buf) - c->len, "%s%s", c->calls ? "," : "", s);
    free(s);
    assert_true(n > 0 && (size_t)n < sizeof(c->buf) - c->len);
    c->len += (size_t)n;
    if (c->calls++ == 0)
        c->first = node;
}

static void test_select(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(select_cases) / sizeof(select_cases[0]); i++) {
        const struct select_case *tc = &select_cases[i];
        print_message("select %s\n", tc->path);
        cJSON *doc = cJSON_Parse(tc->doc ? tc->doc : DOC);
        assert_non_null(doc);
        struct jpath *p = NULL;
        const char *err = NULL;
        assert_int_equal(jpath_compile(tc->path, &p, &err), 0);
        assert_non_null(p);

        struct collect c = {.len = 1};
        c.buf[0] = '[';
        size_t n = jpath_each(p, doc, collect_cb, &c);
        assert_true(c.len + 2 <= sizeof(c.buf));
        c.buf[c.len++] = ']';
        c.buf[c.len] = '\0';
        assert_string_equal(c.buf, tc->want);
        assert_int_equal(n, c.calls);
        assert_int_equal(jpath_each(p, doc, NULL, NULL), n);
        /* jpath_first is the first node jpath_each visits, the very same node. */
        assert_ptr_equal(jpath_first(p, doc), c.first);

        jpath_free(p);
        cJSON_Delete(doc);
    }
}

/* ---- The same paths over another tree: the parsed request document ---- */

/* A value written out the same way from either tree (object members as their values only: the
 * document's navigation has no member names), to compare nodes of two trees. */
struct desc {
    char buf[1024];
    size_t len;
};

static void desc_add(struct desc *o, const char *s, size_t n)
{
    assert_true(o->len + n < sizeof o->buf);
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    o->buf[o->len] = '\0';
}

/* kind: 0 null, 1 false, 2 true, 3 number (v), 4 string (s[0..n)). */
static void desc_scalar(struct desc *o, int kind, double v, const char *s, size_t n)
{
    static const char *const lit[] = {"null", "false", "true"};
    char t[40];
    if (kind < 3) {
        desc_add(o, lit[kind], strlen(lit[kind]));
    } else if (kind == 3) {
        desc_add(o, t, (size_t)snprintf(t, sizeof t, "%.17g", v));
    } else {
        desc_add(o, "\"", 1);
        desc_add(o, s, n);
        desc_add(o, "\"", 1);
    }
}

static void desc_jcs(struct desc *o, const struct jcs_doc *d, const struct jcs_node *n)
{
    double v = 0;
    size_t len = 0;
    const char *s = NULL;
    if (!n) {
        desc_add(o, "none", 4);
        return;
    }
    enum jcs_type t = jcs_node_type(n);
    if (t == JCS_ARRAY || t == JCS_OBJECT) {
        desc_add(o, t == JCS_ARRAY ? "[" : "{", 1);
        for (size_t i = 0; i < jcs_node_count(n); i++) {
            if (i)
                desc_add(o, ",", 1);
            desc_jcs(o, d, jcs_node_at(d, n, i));
        }
        desc_add(o, t == JCS_ARRAY ? "]" : "}", 1);
        return;
    }
    if (t == JCS_NUMBER)
        assert_int_equal(jcs_node_number(d, n, &v), 0);
    if (t == JCS_STRING)
        s = jcs_node_string(d, n, &len);
    desc_scalar(o, (int)t, v, s, len); /* JCS_NULL .. JCS_STRING are 0 .. 4 */
}

static void desc_cjson(struct desc *o, const cJSON *n)
{
    if (!n) {
        desc_add(o, "none", 4);
        return;
    }
    if (cJSON_IsArray(n) || cJSON_IsObject(n)) {
        desc_add(o, cJSON_IsArray(n) ? "[" : "{", 1);
        for (const cJSON *c = n->child; c; c = c->next) {
            if (c != n->child)
                desc_add(o, ",", 1);
            desc_cjson(o, c);
        }
        desc_add(o, cJSON_IsArray(n) ? "]" : "}", 1);
        return;
    }
    int kind = cJSON_IsNull(n)     ? 0
               : cJSON_IsFalse(n)  ? 1
               : cJSON_IsTrue(n)   ? 2
               : cJSON_IsNumber(n) ? 3
                                   : 4;
    desc_scalar(o, kind, n->valuedouble, n->valuestring, kind == 4 ? strlen(n->valuestring) : 0);
}

/* jpath_first_in over the parsed document (reqbody_path_first) selects what jpath_first selects
 * in cJSON's tree of the canonical text, whose members are in the same, canonical, order; and
 * what it selects in the document as written when no wildcard is involved. */
static void test_other_tree(void **state)
{
    (void)state;
    size_t compared = 0;
    for (size_t i = 0; i < sizeof(select_cases) / sizeof(select_cases[0]); i++) {
        const struct select_case *tc = &select_cases[i];
        const char *text = tc->doc ? tc->doc : DOC;
        struct jcs_doc *d = NULL;
        if (jcs_parse(text, strlen(text), 64, &d, NULL))
            continue; /* a repeated name, which the request parse refuses */
        char *canon = NULL;
        size_t clen = 0;
        assert_int_equal(jcs_doc_canonical(d, &canon, &clen), 0);
        cJSON *in_canon = cJSON_Parse(canon), *as_written = cJSON_Parse(text);
        struct jpath *p = NULL;
        assert_int_equal(jpath_compile(tc->path, &p, NULL), 0);
        struct desc got = {.len = 0}, want = {.len = 0}, written = {.len = 0};
        desc_jcs(&got, d, reqbody_path_first(p, d));
        desc_cjson(&want, jpath_first(p, in_canon));
        desc_cjson(&written, jpath_first(p, as_written));
        if (strcmp(got.buf, want.buf) || (!strchr(tc->path, '*') && strcmp(got.buf, written.buf)))
            fail_msg("%s: %s, cJSON %s (as written %s)", tc->path, got.buf, want.buf, written.buf);
        compared++;
        assert_null(reqbody_path_first(NULL, d));
        jpath_free(p);
        cJSON_Delete(in_canon);
        cJSON_Delete(as_written);
        free(canon);
        jcs_doc_free(d);
    }
    assert_true(compared + 2 >= sizeof(select_cases) / sizeof(select_cases[0]));
}

struct error_case {
    const char *path;
    const char *want;
};

static const struct error_case error_cases[] = {
    {"", "path must start with '$' at offset 0"},
    {"id", "path must start with '$' at offset 0"},
    {"a.b", "path must start with '$' at offset 0"},
    {".id", "path must start with '$' at offset 0"},
    {" $.id", "path must start with '$' at offset 0"},
    {"$$", "expected '.' or '[' at offset 1"},
    {"$x", "expected '.' or '[' at offset 1"},
    {"$.abc!", "expected '.' or '[' at offset 5"},
    {"$.a b", "expected '.' or '[' at offset 3"},
    {"$.id ", "expected '.' or '[' at offset 4"},
    {"$.a[*]x", "expected '.' or '[' at offset 6"},
    {"$.a[0]]", "expected '.' or '[' at offset 6"},
    {"$.", "expected member name at offset 2"},
    {"$.a.", "expected member name at offset 4"},
    {"$.a.[0]", "expected member name at offset 4"},
    {"$.caf\xc3\xa9", "expected '.' or '[' at offset 5"},
    {"$.\xc3\xa9", "expected member name at offset 2"},
    {"$.a b.c", "expected '.' or '[' at offset 3"},
    {"$..a", "recursive descent '..' is not supported at offset 1"},
    {"$[", "unterminated '[' at offset 1"},
    {"$.a[", "unterminated '[' at offset 3"},
    {"$[]", "expected quoted name, index or '*' at offset 2"},
    {"$[ 0]", "expected quoted name, index or '*' at offset 2"},
    {"$[a]", "expected quoted name, index or '*' at offset 2"},
    {"$[0", "unterminated '[' at offset 1"},
    {"$.a[*", "unterminated '[' at offset 3"},
    {"$['a'", "unterminated '[' at offset 1"},
    {"$[0x]", "expected ']' at offset 3"},
    {"$[0 ]", "expected ']' at offset 3"},
    {"$[*0]", "expected ']' at offset 3"},
    {"$['a'b]", "expected ']' at offset 5"},
    {"$['a", "unterminated quoted name at offset 2"},
    {"$['a\"]", "unterminated quoted name at offset 2"},
    {"$['a\\']", "unterminated quoted name at offset 2"},
    {"$['']", "empty member name at offset 2"},
    {"$[\"\"]", "empty member name at offset 2"},
    {"$['a\\nb']", "invalid escape in quoted name at offset 4"},
    {"$[01]", "leading zero in index at offset 2"},
    {"$[-01]", "leading zero in index at offset 3"},
    {"$[-0]", "index -0 is not allowed at offset 2"},
    {"$[-]", "expected index digits at offset 3"},
    {"$[--1]", "expected index digits at offset 3"},
    {"$[+1]", "expected quoted name, index or '*' at offset 2"},
    {"$[2147483648]", "index too large at offset 2"},
    {"$[-2147483648]", "index too large at offset 3"},
    {"$[99999999999999999999999]", "index too large at offset 2"},
    {"$.a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q", "too many steps (at most 16) at offset 33"},
    {"$[*][*][*][*][*][*][*][*][*][*][*][*][*][*][*][*][*]",
     "too many steps (at most 16) at offset 49"},
};

static void test_compile_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(error_cases) / sizeof(error_cases[0]); i++) {
        const struct error_case *tc = &error_cases[i];
        print_message("error %s\n", tc->path);
        struct jpath *p = (struct jpath *)&p;
        const char *err = NULL;
        assert_int_equal(jpath_compile(tc->path, &p, &err), -1);
        assert_null(p);
        assert_non_null(err);
        assert_string_equal(err, tc->want);
        /* err may be NULL when the caller does not want the message. */
        assert_int_equal(jpath_compile(tc->path, &p, NULL), -1);
        assert_null(p);
    }
    struct jpath *p = NULL;
    const char *err = NULL;
    assert_int_equal(jpath_compile(NULL, &p, &err), -1);
    assert_null(p);
    assert_string_equal(err, "path must start with '$' at offset 0");
}

/* Exactly JPATH_MAX_STEPS steps compile and reach the innermost value. */
static void test_max_steps(void **state)
{
    (void)state;
    char path[128] = "$";
    cJSON *doc = cJSON_CreateNumber(42);
    assert_non_null(doc);
    for (int i = 0; i < JPATH_MAX_STEPS; i++) {
        strcat(path, ".a");
        cJSON *parent = cJSON_CreateObject();
        assert_non_null(parent);
        cJSON_AddItemToObject(parent, "a", doc);
        doc = parent;
    }
    struct jpath *p = NULL;
    const char *err = NULL;
    assert_int_equal(jpath_compile(path, &p, &err), 0);
    const cJSON *v = jpath_first(p, doc);
    assert_true(cJSON_IsNumber(v));
    assert_int_equal(v->valueint, 42);
    jpath_free(p);
    cJSON_Delete(doc);
}

struct string_case {
    const char *path;
    const char *want; /* NULL: jpath_string returns NULL */
};

static const struct string_case string_cases[] = {
    {"$.id", "gen_1"},
    {"$.data[*].url", "u0"},
    {"$.output[-1]", "o2"},
    {"$.empty_string", ""},
    {"$.n", NULL},
    {"$.nil", NULL},
    {"$.t", NULL},
    {"$.urls", NULL},
    {"$.output", NULL},
    {"$.missing", NULL},
    {"$", NULL},
};

static void test_string(void **state)
{
    (void)state;
    cJSON *doc = cJSON_Parse("{\"id\":\"gen_1\",\"data\":[{\"x\":1},{\"url\":\"u0\"}],"
                             "\"output\":[\"o0\",\"o2\"],\"empty_string\":\"\",\"n\":7,"
                             "\"nil\":null,\"t\":true,\"urls\":{\"get\":\"g\"}}");
    assert_non_null(doc);
    for (size_t i = 0; i < sizeof(string_cases) / sizeof(string_cases[0]); i++) {
        print_message("string %s\n", string_cases[i].path);
        struct jpath *p = NULL;
        const char *err = NULL;
        assert_int_equal(jpath_compile(string_cases[i].path, &p, &err), 0);
        const char *s = jpath_string(p, doc);
        if (string_cases[i].want)
            assert_string_equal(s, string_cases[i].want);
        else
            assert_null(s);
        jpath_free(p);
    }
    cJSON_Delete(doc);
}

static void test_null_root_and_free(void **state)
{
    (void)state;
    struct jpath *p = NULL;
    const char *err = NULL;
    assert_int_equal(jpath_compile("$", &p, &err), 0);
    assert_null(jpath_first(p, NULL));
    assert_int_equal(jpath_each(p, NULL, collect_cb, NULL), 0);
    assert_null(jpath_string(p, NULL));
    jpath_free(p);
    jpath_free(NULL);
}

/* A compiled path does not keep a pointer into the text it was compiled from. */
static void test_path_owns_names(void **state)
{
    (void)state;
    char text[] = "$['a b'].c";
    struct jpath *p = NULL;
    const char *err = NULL;
    assert_int_equal(jpath_compile(text, &p, &err), 0);
    memset(text, 'x', sizeof(text) - 1);
    cJSON *doc = cJSON_Parse("{\"a b\":{\"c\":\"ok\"}}");
    assert_non_null(doc);
    assert_string_equal(jpath_string(p, doc), "ok");
    cJSON_Delete(doc);
    jpath_free(p);
}

/* jpath_each_list: a last wildcard that meets a string selects it (a list written as its one
 * value); everything else as jpath_each. */
static void test_each_list(void **state)
{
    (void)state;
    static const struct {
        const char *path, *doc, *want;
    } cases[] = {
        {"$.output[*]", "{\"output\": [\"a\", \"b\"]}", "[\"a\",\"b\"]"},
        {"$.output[*]", "{\"output\": \"a\"}", "[\"a\"]"},
        {"$.output.*", "{\"output\": \"a\"}", "[\"a\"]"},
        {"$.output[*]", "{\"output\": null}", "[]"},
        {"$.output[*]", "{\"output\": 7}", "[]"},
        {"$.output[*]", "{\"output\": []}", "[]"},
        {"$.output[*]", "{}", "[]"},
        /* Only the last step: a wildcard further up that meets a string selects nothing. */
        {"$.output[*].url", "{\"output\": \"a\"}", "[]"},
        {"$.output[*].url", "{\"output\": [{\"url\": \"a\"}, \"b\"]}", "[\"a\"]"},
        {"$.o[*][*]", "{\"o\": [\"a\", [\"b\"]]}", "[\"a\",\"b\"]"},
        {"$.output", "{\"output\": \"a\"}", "[\"a\"]"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        print_message("each_list %s %s\n", cases[i].path, cases[i].doc);
        cJSON *doc = cJSON_Parse(cases[i].doc);
        assert_non_null(doc);
        struct jpath *p = NULL;
        assert_int_equal(jpath_compile(cases[i].path, &p, NULL), 0);
        struct collect c = {.len = 1};
        c.buf[0] = '[';
        size_t n = jpath_each_list(p, doc, collect_cb, &c);
        c.buf[c.len++] = ']';
        c.buf[c.len] = '\0';
        assert_string_equal(c.buf, cases[i].want);
        assert_int_equal(n, c.calls);
        assert_int_equal(jpath_each_list(p, doc, NULL, NULL), n);
        jpath_free(p);
        cJSON_Delete(doc);
    }
    /* jpath_each keeps the JSONPath meaning: a wildcard on a string selects nothing. */
    cJSON *doc = cJSON_Parse("{\"output\": \"a\"}");
    struct jpath *p = NULL;
    assert_int_equal(jpath_compile("$.output[*]", &p, NULL), 0);
    assert_int_equal(jpath_each(p, doc, NULL, NULL), 0);
    assert_int_equal(jpath_each_list(NULL, doc, NULL, NULL), 0);
    assert_int_equal(jpath_each_list(p, NULL, NULL, NULL), 0);
    jpath_free(p);
    cJSON_Delete(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_list),
        cmocka_unit_test(test_select),          cmocka_unit_test(test_other_tree),
        cmocka_unit_test(test_compile_errors),  cmocka_unit_test(test_max_steps),
        cmocka_unit_test(test_string),          cmocka_unit_test(test_null_root_and_free),
        cmocka_unit_test(test_path_owns_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
