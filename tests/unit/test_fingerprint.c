/* The fingerprint of version 1 (FP_VERSION), pinned: what makes a retry "the same request" must
 * never change under rows already stored with this version — a stored job's duplicate would be
 * refused as a different request (422) after an upgrade. Each body below is canonicalised as the
 * intake does (reqbody_init: RFC 8785, the delivery members of a streaming provider left out)
 * and fingerprinted; the hex values are its contract. A change
 * of canonicalisation or of the fingerprint's inputs must come with a new FP_VERSION (and the
 * old definition kept for the rows stored under it): this test then fails, and says so. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/fingerprint.h"
#include "idemgate/reqbody.h"
#include "idemgate/sse.h"

static void fingerprint(const char *body, int streaming, char out[CRYPTO_SHA256_HEX])
{
    struct reqbody_needs needs = {.max_depth = 64,
                                  .fp_skip = streaming ? sse_delivery_members : NULL};
    struct reqbody b;
    if (reqbody_init(&b, body, strlen(body), &needs, NULL) != 0)
        fail_msg("not parsed: %s", body);
    fp_compute("mock-images", 11, "images/generations", 18, b.canon, b.canon_len, out);
    reqbody_fini(&b);
}

static void test_version_1_is_pinned(void **state)
{
    (void)state;
    assert_int_equal(FP_VERSION, 1);
    static const struct {
        const char *body;
        int streaming;
        const char *hex;
    } rows[] = {
        /* SHA-256 of "idemgate-fingerprint-v1\0mock-images\0images/generations\0" and the
         * canonical body. Rows 0, 1 and 3-6 were checked against the same hash of the canonical
         * text written out by hand (members sorted, no spaces, escapes as RFC 8785 writes
         * them); numbers are written from their exact value, not their double's shortest form
         * (row 3 keeps 9007199254740993 and 0.10000000000000001). */
        {"{\"prompt\":\"a fox\",\"n\":2}", 0,
         "3d1ffcabfb770c6fd859693767af64a10a04863808e3b6b1c63f034fb84c3fda"},
        {"{\"n\":2,\"prompt\":\"a fox\"}", 0,
         "3d1ffcabfb770c6fd859693767af64a10a04863808e3b6b1c63f034fb84c3fda"},
        {"{\"x\":1.5e3,\"y\":-0.0,\"z\":1e-7,\"w\":123456789012345678901234567890}", 0,
         "c3a088fbb18338b32b4483fa8af6e84cef31d9b7ba400529e6f88c92e0a6aba9"},
        {"{\"n\":9007199254740993,\"f\":0.10000000000000001}", 0,
         "1b4fa669479d787b8a80217dc129528a87588f1b7aefa0fe64bcd267e2ccb001"},
        {"{\"s\":\"\\u00e9\\ud83d\\ude00\\t\\\"\",\"k\\u0041\":[true,false,null,{}]}", 0,
         "46eaf8bd888c13c882ea6afc60bf9ab2ff024bad737aea41cd5bf5d55559aee9"},
        {"{\"model\":\"gpt-4o-mini\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}", 1,
         "424bc4a40225c4803154d7bcf78bf2bfd30f34a3744c12048f67cf7a0536d471"},
        {"{\"model\":\"gpt-4o-mini\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}", 0,
         "30630673443fe8c9917ff47e3637c885fde811d4c1d7a2fac15fa1162661f94c"},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char hex[CRYPTO_SHA256_HEX];
        fingerprint(rows[i].body, rows[i].streaming, hex);
        if (strcmp(hex, rows[i].hex) != 0)
            fail_msg("row %zu (%s): fingerprint %s, pinned %s — a change of the fingerprint "
                     "needs a new FP_VERSION",
                     i, rows[i].body, hex, rows[i].hex);
    }
}

/* Requests the same by RFC 8785 fingerprint alike; different ones do not. */
static void test_same_and_different(void **state)
{
    (void)state;
    static const struct {
        const char *a, *b;
        int streaming, same;
    } rows[] = {
        {"{\"b\":1,\"a\":2}", "{ \"a\" : 2 , \"b\" : 1 }", 0, 1},
        {"{\"n\":1}", "{\"n\":1.0}", 0, 1},
        {"{\"n\":1}", "{\"n\":10e-1}", 0, 1},
        {"{\"s\":\"\\u00e9\"}", "{\"s\":\"\xc3\xa9\"}", 0, 1},
        {"{\"n\":9007199254740993}", "{\"n\":9007199254740992}", 0, 0},
        {"{\"a\":[1,2]}", "{\"a\":[2,1]}", 0, 0},
        {"{\"m\":\"x\",\"stream\":true}", "{\"m\":\"x\"}", 1, 1},
        {"{\"m\":\"x\",\"stream\":true}", "{\"m\":\"x\"}", 0, 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char ha[CRYPTO_SHA256_HEX], hb[CRYPTO_SHA256_HEX];
        fingerprint(rows[i].a, rows[i].streaming, ha);
        fingerprint(rows[i].b, rows[i].streaming, hb);
        if ((strcmp(ha, hb) == 0) != rows[i].same)
            fail_msg("row %zu: %s / %s: %s, want %s", i, rows[i].a, rows[i].b,
                     strcmp(ha, hb) == 0 ? "same" : "different",
                     rows[i].same ? "same" : "different");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_1_is_pinned),
        cmocka_unit_test(test_same_and_different),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
