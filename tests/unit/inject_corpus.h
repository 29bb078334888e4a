/* The client-reference corpus: bodies with a field to place and what placing it gives, and every
 * prefix and single-byte change of those bodies. Shared by test_inject.c (inject_check against
 * inject_member) and test_reqbody.c (the one-parse answers against the byte scanners). Include
 * it after <cmocka.h>. */
#ifndef IDEMGATE_TEST_INJECT_CORPUS_H
#define IDEMGATE_TEST_INJECT_CORPUS_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "idemgate/inject.h"

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

/* An exact-size heap copy of in[0..len), so that ASan sees any read past len. */
static inline char *heap_copy(const char *in, size_t len)
{
    char *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, in, len);
    return copy;
}

/* One input of the mutation corpus: seed `row` cut to `cut` bytes, with byte `pos` replaced (when
 * pos < cut), on an exact-size heap copy. */
struct mutation {
    size_t row, cut, pos;
    const char *in;
    size_t len;
    const char *field; /* the seed's field */
};

typedef void corpus_fn(const struct mutation *m, void *arg);

/* Calls fn on every prefix of seed and on every single-byte change to it (each byte in turn
 * replaced by each of the JSON-significant bytes below, and by NUL); returns how many. */
static inline size_t corpus_mutate(size_t row, const char *seed, const char *field, corpus_fn *fn,
                                   void *arg)
{
    static const char subst[] = "\"\\{}[]:, u0.\n";
    size_t len = strlen(seed), tried = 0;
    for (size_t cut = 0; cut <= len; cut++) {
        for (size_t pos = 0; pos <= cut; pos++) {
            for (size_t k = 0; k < (pos < cut ? sizeof subst : 1); k++) {
                char *in = heap_copy(seed, cut);
                if (pos < cut)
                    in[pos] = subst[k]; /* the last k is the terminating NUL: a NUL byte */
                struct mutation m = {row, cut, pos, in, cut, field};
                fn(&m, arg);
                free(in);
                tried++;
            }
        }
    }
    return tried;
}

/* corpus_mutate on every row of the table; returns how many inputs there were. */
static inline size_t corpus_each(corpus_fn *fn, void *arg)
{
    size_t tried = 0;
    for (size_t i = 0; i < NROWS; i++)
        tried += corpus_mutate(i, rows[i].in, rows[i].field, fn, arg);
    return tried;
}

#endif
