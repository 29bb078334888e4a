/* multipart/form-data (multipart.h): the boundary of a Content-Type, the strict reading, the
 * canonical form (boundary- and field-order-blind, blind to nothing else), the text fields a
 * profile's paths read, and the Content-Type a stored body is sent with. Table-driven. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/multipart.h"

static void test_boundary(void **state)
{
    (void)state;
    static const struct {
        const char *ctype, *boundary; /* NULL: refused */
    } cases[] = {
        {"multipart/form-data; boundary=abc", "abc"},
        {"Multipart/Form-Data;boundary=abc", "abc"},
        {"multipart/form-data; charset=utf-8; boundary=----x1", "----x1"},
        {"multipart/form-data; boundary=\"a b:c\"", "a b:c"},
        {"multipart/form-data; BOUNDARY=abc", "abc"},
        {"multipart/form-data", NULL},
        {"multipart/mixed; boundary=abc", NULL},
        {"application/json", NULL},
        {"multipart/form-data; boundary=", NULL},
        {"multipart/form-data; boundary=\"\"", NULL},
        {"multipart/form-data; boundary=\"ends in space \"", NULL},
        {"multipart/form-data; boundary=a; boundary=b", NULL},
        {"multipart/form-data; boundary=\"a@b\"", NULL},
        {"multipart/form-data; boundary=\"unterminated", NULL},
        {"multipart/form-data; boundary=1234567890123456789012345678901234567890123456789012345678901234567890",
         "1234567890123456789012345678901234567890123456789012345678901234567890"},
        {"multipart/form-data; boundary=12345678901234567890123456789012345678901234567890123456789012345678901",
         NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char b[MP_BOUNDARY_MAX + 1];
        print_message("%s\n", cases[i].ctype);
        int n = mp_boundary(cases[i].ctype, b);
        if (!cases[i].boundary) {
            assert_int_equal(n, -1);
            continue;
        }
        assert_int_equal(n, (int)strlen(cases[i].boundary));
        assert_string_equal(b, cases[i].boundary);
    }
}

#define IMG "\x89PNG\r\n\x1a\n\0\1\2--not-a-delimiter\r\n"
#define IMG_LEN (sizeof(IMG) - 1)

/* A body of three parts in the order given by which (a permutation of "pmi": prompt, model,
 * image), under boundary b. */
static size_t body_of(char *out, const char *b, const char *which, const char *prompt)
{
    size_t o = 0;
    for (const char *w = which; *w; w++) {
        o += (size_t)sprintf(out + o, "--%s\r\n", b);
        if (*w == 'p')
            o += (size_t)sprintf(out + o,
                                 "Content-Disposition: form-data; name=\"prompt\"\r\n\r\n%s\r\n",
                                 prompt);
        else if (*w == 'm')
            o += (size_t)sprintf(out + o, "Content-Disposition: form-data; name=model\r\n\r\n"
                                          "gpt-image-1\r\n");
        else {
            o += (size_t)sprintf(out + o, "Content-Disposition: form-data; name=\"image[]\"; "
                                          "filename=\"cat.png\"\r\nContent-Type: image/png\r\n\r\n");
            memcpy(out + o, IMG, IMG_LEN);
            o += IMG_LEN;
            o += (size_t)sprintf(out + o, "\r\n");
        }
    }
    o += (size_t)sprintf(out + o, "--%s--\r\n", b);
    return o;
}

static char *canon_of(const char *body, size_t len, const char *b)
{
    struct mp_part parts[8];
    size_t n = 0, cl = 0;
    char why[128];
    if (mp_parse(body, len, b, parts, 8, &n, why, sizeof(why)) < 0) {
        print_message("refused: %s\n", why);
        return NULL;
    }
    return mp_canonical(parts, n, &cl);
}

static void test_parse_and_canonical(void **state)
{
    (void)state;
    char a[1024], b[1024];
    size_t al = body_of(a, "xyz", "pmi", "a cat");
    struct mp_part parts[8];
    size_t n = 0;
    char why[128];
    assert_int_equal(mp_parse(a, al, "xyz", parts, 8, &n, why, sizeof(why)), 0);
    assert_int_equal(n, 3);
    assert_int_equal(parts[0].name_len, 6);
    assert_memory_equal(parts[0].name, "prompt", 6);
    assert_null(parts[0].filename);
    assert_null(parts[0].ctype);
    assert_memory_equal(parts[0].data, "a cat", 5);
    assert_int_equal(parts[1].name_len, 5); /* a token name */
    assert_int_equal(parts[2].data_len, IMG_LEN); /* binary, a NUL and a near-delimiter in it */
    assert_memory_equal(parts[2].data, IMG, IMG_LEN);
    assert_memory_equal(parts[2].filename, "cat.png", 7);
    assert_memory_equal(parts[2].ctype, "image/png", 9);

    char *ca = canon_of(a, al, "xyz");
    assert_non_null(ca);
    assert_memory_equal(ca, "multipart/form-data\n", 20);
    /* Same parts, another boundary and another order of differently named parts: the same. */
    static const struct {
        const char *boundary, *order, *prompt;
        int same;
    } cases[] = {
        {"xyz", "pmi", "a cat", 1},
        {"----WebKitFormBoundary7MA4YWxkTrZu0gW", "imp", "a cat", 1},
        {"q", "mip", "a cat", 1},
        {"xyz", "pmi", "a dog", 0},
        {"xyz", "pm", "a cat", 0},
        {"xyz", "pmii", "a cat", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t bl = body_of(b, cases[i].boundary, cases[i].order, cases[i].prompt);
        char *cb = canon_of(b, bl, cases[i].boundary);
        assert_non_null(cb);
        print_message("%s %s %s\n", cases[i].boundary, cases[i].order, cases[i].prompt);
        assert_int_equal(strcmp(ca, cb) == 0, cases[i].same);
        free(cb);
    }
    free(ca);
}

/* Two files under one name are a list: their order is kept, so swapping them differs. */
static void test_same_name_keeps_order(void **state)
{
    (void)state;
    static const char one[] = "--b\r\nContent-Disposition: form-data; name=\"image[]\"; "
                              "filename=\"a.png\"\r\n\r\nAAA\r\n"
                              "--b\r\nContent-Disposition: form-data; name=\"image[]\"; "
                              "filename=\"b.png\"\r\n\r\nBBB\r\n--b--";
    static const char two[] = "--b\r\nContent-Disposition: form-data; name=\"image[]\"; "
                              "filename=\"b.png\"\r\n\r\nBBB\r\n"
                              "--b\r\nContent-Disposition: form-data; name=\"image[]\"; "
                              "filename=\"a.png\"\r\n\r\nAAA\r\n--b--";
    char *c1 = canon_of(one, sizeof(one) - 1, "b"), *c2 = canon_of(two, sizeof(two) - 1, "b");
    assert_non_null(c1);
    assert_non_null(c2);
    assert_int_not_equal(strcmp(c1, c2), 0);
    free(c1);
    free(c2);
}

/* A filename, a content type, an absent filename: each is part of the meaning. */
static void test_metadata_counts(void **state)
{
    (void)state;
    static const char *const bodies[] = {
        "--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a.png\"\r\n\r\nX\r\n--b--",
        "--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"b.png\"\r\n\r\nX\r\n--b--",
        "--b\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\nX\r\n--b--",
        "--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a.png\"\r\n"
        "Content-Type: image/png\r\n\r\nX\r\n--b--",
        "--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"\"\r\n\r\nX\r\n--b--",
    };
    size_t k = sizeof(bodies) / sizeof(bodies[0]);
    char *c[8];
    for (size_t i = 0; i < k; i++) {
        c[i] = canon_of(bodies[i], strlen(bodies[i]), "b");
        assert_non_null(c[i]);
        for (size_t j = 0; j < i; j++)
            assert_int_not_equal(strcmp(c[i], c[j]), 0);
    }
    for (size_t i = 0; i < k; i++)
        free(c[i]);
}

static void test_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        "--b--",                                                         /* no part */
        "preamble\r\n--b\r\nContent-Disposition: form-data; name=x\r\n\r\n1\r\n--b--",
        "--b\r\nContent-Disposition: form-data; name=x\r\n\r\n1\r\n--b",   /* not closed */
        "--b\r\nContent-Disposition: form-data; name=x\r\n\r\n1",          /* no delimiter */
        "--b\r\nContent-Disposition: form-data; name=x\r\n\r\n1\r\n--b--epilogue",
        "--b\r\nContent-Disposition: form-data; name=x\r\n\r\n1\r\n--b  \r\n"
        "Content-Disposition: form-data; name=y\r\n\r\n2\r\n--b--",       /* padding */
        "--b\r\n\r\n1\r\n--b--",                                          /* no header */
        "--b\r\nContent-Type: text/plain\r\n\r\n1\r\n--b--",              /* no disposition */
        "--b\r\nContent-Disposition: attachment; name=x\r\n\r\n1\r\n--b--",
        "--b\r\nContent-Disposition: form-data\r\n\r\n1\r\n--b--",        /* no name */
        "--b\r\nContent-Disposition: form-data; name=x; name=y\r\n\r\n1\r\n--b--",
        "--b\r\nContent-Disposition: form-data; name=x; filename*=UTF-8''a\r\n\r\n1\r\n--b--",
        "--b\r\nContent-Disposition: form-data; name=x\r\n"
        "Content-Disposition: form-data; name=y\r\n\r\n1\r\n--b--",
        "--b\r\nContent-Disposition: form-data; name=x\r\nContent-Transfer-Encoding: base64\r\n"
        "\r\n1\r\n--b--",
        "--b\r\nContent-Disposition: form-data; name=x\r\nContent-Type: a\r\nContent-Type: b\r\n"
        "\r\n1\r\n--b--",
        "--b\r\nContent-Disposition: form-data; name=\"x\r\n\r\n1\r\n--b--",
        "--b\r\nBad Header: 1\r\nContent-Disposition: form-data; name=x\r\n\r\n1\r\n--b--",
        /* The boundary in a part's content, where lenient readers see a delimiter: a hidden
         * part n=10 (at the content's start; after a bare LF). */
        "--b\r\nContent-Disposition: form-data; name=a\r\n\r\n--b\r\n"
        "Content-Disposition: form-data; name=n\r\n\r\n10\r\n--b--",
        "--b\r\nContent-Disposition: form-data; name=a\r\n\r\nx\n--b\r\n"
        "Content-Disposition: form-data; name=n\r\n\r\n10\r\n--b--",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct mp_part parts[4];
        size_t n = 0;
        char why[128] = "";
        print_message("%zu: %s\n", i, bad[i]);
        assert_int_equal(mp_parse(bad[i], strlen(bad[i]), "b", parts, 4, &n, why, sizeof(why)),
                         -1);
        assert_true(why[0] != '\0');
    }
    /* More parts than room. */
    static const char three[] = "--b\r\nContent-Disposition: form-data; name=a\r\n\r\n1\r\n"
                                "--b\r\nContent-Disposition: form-data; name=b\r\n\r\n2\r\n"
                                "--b\r\nContent-Disposition: form-data; name=c\r\n\r\n3\r\n--b--";
    struct mp_part parts[2];
    size_t n = 0;
    assert_int_equal(mp_parse(three, sizeof(three) - 1, "b", parts, 2, &n, NULL, 0), -1);
    struct mp_part more[3];
    assert_int_equal(mp_parse(three, sizeof(three) - 1, "b", more, 3, &n, NULL, 0), 0);
    assert_int_equal(n, 3);
    /* A malformed boundary is refused before the body is read. */
    assert_int_equal(mp_parse(three, sizeof(three) - 1, "b@", more, 3, &n, NULL, 0), -1);
}

static void test_fields_json(void **state)
{
    (void)state;
    static const char body[] =
        "--b\r\nContent-Disposition: form-data; name=\"n\"\r\n\r\n2\r\n"
        "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ngpt-image-1\r\n"
        "--b\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\na \"quoted\" \\ cat\r\n"
        "--b\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n\r\n1\r\n"
        "--b\r\nContent-Disposition: form-data; name=\"n\"\r\n\r\n9\r\n"
        "--b\r\nContent-Disposition: form-data; name=\"size\"\r\n\r\n01\r\n"
        "--b\r\nContent-Disposition: form-data; name=\"bin\"\r\n\r\n\xff\xfe\r\n"
        "--b\r\nContent-Disposition: form-data; name=\"line\"\r\n\r\na\nb\r\n"
        "--b\r\nContent-Disposition: form-data; name=\"x\\\"y\"\r\n\r\nz\r\n"
        "--b--\r\n";
    struct mp_part parts[16];
    size_t n = 0, len = 0;
    assert_int_equal(mp_parse(body, sizeof(body) - 1, "b", parts, 16, &n, NULL, 0), 0);
    assert_int_equal(n, 9);
    char *j = mp_fields_json(parts, n, &len);
    assert_non_null(j);
    assert_string_equal(j, "{\"n\":2,\"model\":\"gpt-image-1\","
                           "\"prompt\":\"a \\\"quoted\\\" \\\\ cat\",\"size\":\"01\"}");
    assert_int_equal(len, strlen(j));
    free(j);
}

/* A text field read two ways (repeated, or its name escaped) is refused; a list by its name's
 * convention, repeated files, and distinct fields are not. */
static void test_ambiguous_fields(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        long want;
    } cases[] = {
        {"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nsora-2\r\n"
         "--b\r\nContent-Disposition: form-data; name=\"seconds\"\r\n\r\n4\r\n"
         "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nsora-2-pro\r\n--b--\r\n",
         2},
        {"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\na\r\n"
         "--b\r\nContent-Disposition: form-data; name=\"mo\\del\"\r\n\r\nb\r\n--b--\r\n",
         1},
        {"--b\r\nContent-Disposition: form-data; name=\"t[]\"\r\n\r\nword\r\n"
         "--b\r\nContent-Disposition: form-data; name=\"t[]\"\r\n\r\nsegment\r\n--b--\r\n",
         -1},
        {"--b\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n\r\n1\r\n"
         "--b\r\nContent-Disposition: form-data; name=\"image\"; filename=\"b.png\"\r\n\r\n2\r\n"
         "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--\r\n",
         -1},
        {"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n"
         "--b\r\nContent-Disposition: form-data; name=\"Model\"\r\n\r\nn\r\n--b--\r\n",
         -1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct mp_part parts[8];
        size_t n = 0;
        assert_int_equal(mp_parse(cases[i].body, strlen(cases[i].body), "b", parts, 8, &n, NULL,
                                  0),
                         0);
        if (mp_ambiguous_field(parts, n) != cases[i].want)
            fail_msg("case %zu", i);
    }
}

/* The parts a provider may read as the member where the gateway's client reference lives. */
static void test_part_under_member(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        const char *member;
        long want;
    } cases[] = {
        {"metadata", "metadata.client_ref", 0},
        {"metadata[client_ref]", "metadata.client_ref", 0},
        {"metadata[other]", "metadata.client_ref", 0}, /* the member's object, whole */
        {"metadata.client_ref", "metadata.client_ref", 0},
        {"Metadata", "metadata.client_ref", 0},
        {"client_ref", "client_ref", 0},
        {"client_ref[]", "client_ref", 0},
        {"metadatas", "metadata.client_ref", -1},
        {"meta", "metadata.client_ref", -1},
        {"prompt", "client_ref", -1},
        {"client_reference", "client_ref", -1},
        {"metadata", NULL, -1},
        {"metadata", "", -1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char body[256];
        snprintf(body, sizeof(body),
                 "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n"
                 "--b\r\nContent-Disposition: form-data; name=\"%s\"\r\n\r\nv\r\n--b--\r\n",
                 cases[i].name);
        struct mp_part parts[4];
        size_t n = 0;
        assert_int_equal(mp_parse(body, strlen(body), "b", parts, 4, &n, NULL, 0), 0);
        long got = mp_part_under_member(parts, n, cases[i].member);
        long want = cases[i].want < 0 ? -1 : 1; /* the second part, after "model" */
        if (got != want)
            fail_msg("case %zu (%s under %s): %ld", i, cases[i].name,
                     cases[i].member ? cases[i].member : "NULL", got);
    }
}

/* What pricing and the outputs asked for read of a field as a provider may: a number with white
 * space around it is that number; a repeated field its first value that is a field at all. */
static void test_fields_json_numbers(void **state)
{
    (void)state;
    static const struct {
        const char *fields[4]; /* name=value; NULL ends */
        const char *json;
    } cases[] = {
        {{"n= 10", NULL}, "{\"n\":10}"},
        {{"n=10\t", NULL}, "{\"n\":10}"},
        {{"n=\r\n4 \r\n", NULL}, "{\"n\":4}"},
        {{"n=1", "n=10", NULL}, "{\"n\":1}"},
        {{"n=10 ", "n=1", NULL}, "{\"n\":10}"},
        {{"n=ten", "n=10", NULL}, "{\"n\":\"ten\"}"},
        {{"n=a\x01", "n=10", NULL}, "{\"n\":10}"}, /* the first that is a field at all */
        {{"n=\x0b5", NULL}, "{}"},                   /* a vertical tab is not trimmed */
        {{"s=a b ", NULL}, "{\"s\":\"a b \"}"},      /* a string is kept as written */
        {{"n= ", NULL}, "{\"n\":\" \"}"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char body[512];
        size_t o = 0;
        for (size_t f = 0; cases[c].fields[f]; f++) {
            const char *eq = strchr(cases[c].fields[f], '=');
            o += (size_t)snprintf(body + o, sizeof(body) - o,
                                  "--b\r\nContent-Disposition: form-data; name=\"%.*s\""
                                  "\r\n\r\n%s\r\n",
                                  (int)(eq - cases[c].fields[f]), cases[c].fields[f], eq + 1);
        }
        o += (size_t)snprintf(body + o, sizeof(body) - o, "--b--\r\n");
        struct mp_part parts[8];
        size_t n = 0, len = 0;
        print_message("case %zu\n", c);
        assert_int_equal(mp_parse(body, o, "b", parts, 8, &n, NULL, 0), 0);
        char *j = mp_fields_json(parts, n, &len);
        assert_non_null(j);
        assert_string_equal(j, cases[c].json);
        free(j);
    }
}

static void test_content_type_of(void **state)
{
    (void)state;
    static const struct {
        const char *body, *ctype; /* ctype NULL: not multipart */
    } cases[] = {
        {"--abc\r\nContent-Disposition: form-data; name=x\r\n\r\n1\r\n--abc--",
         "multipart/form-data; boundary=abc"},
        {"--a b:c\r\nrest", "multipart/form-data; boundary=\"a b:c\""},
        {"{\"prompt\":\"--x\"}", NULL},
        {"--abc", NULL},
        {"--\r\n", NULL},
        {"--a@b\r\n", NULL},
        {"-abc\r\n", NULL},
        {"", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[MP_CTYPE_MAX];
        int m = mp_content_type_of(cases[i].body, strlen(cases[i].body), out, sizeof(out));
        print_message("%s\n", cases[i].body);
        assert_int_equal(m, cases[i].ctype != NULL);
        assert_string_equal(out, cases[i].ctype ? cases[i].ctype : "");
    }
    /* The longest boundary, quoted, fits. */
    char body[128], out[MP_CTYPE_MAX];
    snprintf(body, sizeof(body), "--%s\r\n", "123456789 123456789 123456789 123456789 "
                                              "123456789 123456789 1234567890");
    assert_int_equal(mp_content_type_of(body, strlen(body), out, sizeof(out)), 1);
    char b[MP_BOUNDARY_MAX + 1];
    assert_int_equal(mp_boundary(out, b), MP_BOUNDARY_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_boundary),         cmocka_unit_test(test_parse_and_canonical),
        cmocka_unit_test(test_same_name_keeps_order), cmocka_unit_test(test_metadata_counts),
        cmocka_unit_test(test_refused),          cmocka_unit_test(test_fields_json),
        cmocka_unit_test(test_fields_json_numbers),
        cmocka_unit_test(test_ambiguous_fields),
        cmocka_unit_test(test_part_under_member),
        cmocka_unit_test(test_content_type_of),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
