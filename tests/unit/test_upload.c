/* Upload parts kept in the archive store (upload.h): which parts go out, the stored form the row
 * keeps, its strict reading, the byte-exact expansion, and what follows a part that cannot be
 * read back. Table-driven. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/crypto.h"
#include "idemgate/multipart.h"
#include "idemgate/upload.h"

#define SHA_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define SHA_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

static void test_select(void **state)
{
    (void)state;
    /* three files, then a text field (no filename) as long as the longest file */
    struct mp_part parts[4] = {{.filename = "a", .data_len = 0},
                               {.filename = "b", .data_len = 10},
                               {.filename = "c", .data_len = 11},
                               {.data_len = 11}};
    static const struct {
        long threshold;
        unsigned char want[4];
        size_t n;
    } cases[] = {
        {0, {0, 0, 0, 0}, 0},   /* off: every upload whole in the row */
        {-1, {0, 0, 0, 0}, 0},  /* never negative in a configuration, still off */
        {10, {0, 0, 1, 0}, 1},  /* longer than the threshold, not equal; a text field stays */
        {9, {0, 1, 1, 0}, 2},
        {1, {0, 1, 1, 0}, 2},   /* an empty part never goes */
        {65536, {0, 0, 0, 0}, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        unsigned char sel[4];
        assert_int_equal(upl_select(parts, 4, cases[i].threshold, sel), cases[i].n);
        assert_memory_equal(sel, cases[i].want, 4);
    }
}

/* A multipart body: a text field, then n_files file parts of the sizes given. */
static size_t body_of(char *out, size_t cap, const size_t *sizes, size_t n_files)
{
    size_t pos = (size_t)snprintf(out, cap,
                                  "--xyz\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\n"
                                  "a red boat\r\n");
    for (size_t f = 0; f < n_files; f++) {
        pos += (size_t)snprintf(out + pos, cap - pos,
                                "--xyz\r\nContent-Disposition: form-data; name=\"image[]\"; "
                                "filename=\"f%zu.png\"\r\nContent-Type: image/png\r\n\r\n",
                                f);
        for (size_t i = 0; i < sizes[f]; i++) /* bytes of every value, the boundary's among them */
            out[pos++] = (char)((i * 7 + f) % 256);
        pos += (size_t)snprintf(out + pos, cap - pos, "\r\n");
    }
    pos += (size_t)snprintf(out + pos, cap - pos, "--xyz--\r\n");
    return pos;
}

/* The objects of a round trip: the parts' contents by SHA-256. */
struct objects {
    const struct mp_part *parts;
    size_t n;
    int calls;
    int fail; /* answer this instead, from the call numbered fail_at */
    int fail_at;
};

static int fetch(void *arg, const struct upl_ref *ref, char *dst)
{
    struct objects *o = arg;
    if (o->fail && ++o->calls >= o->fail_at)
        return o->fail;
    for (size_t i = 0; i < o->n; i++) {
        char sha[CRYPTO_SHA256_HEX];
        crypto_sha256_hex(o->parts[i].data, o->parts[i].data_len, sha);
        if (strcmp(sha, ref->sha256) == 0 && o->parts[i].data_len == ref->size) {
            memcpy(dst, o->parts[i].data, ref->size);
            return 0;
        }
    }
    return UPL_MISSING;
}

static void test_round_trip(void **state)
{
    (void)state;
    static const struct {
        size_t sizes[3];
        size_t n_files;
        long threshold;
        size_t out; /* parts that go to the store */
    } cases[] = {
        {{100000}, 1, 65536, 1},
        {{100000, 10, 70000}, 3, 65536, 2},  /* the small one in between stays */
        {{65536}, 1, 65536, 0},              /* at the threshold: stays */
        {{1, 2, 3}, 3, 0, 0},                /* off */
        {{300, 300, 300}, 3, 100, 3},        /* the same bytes twice over: one object */
        {{0, 200}, 2, 100, 1},
    };
    size_t cap = 400000;
    char *body = malloc(cap);
    assert_non_null(body);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        size_t len = body_of(body, cap, cases[c].sizes, cases[c].n_files);
        struct mp_part parts[8];
        size_t n = 0;
        char why[128];
        assert_int_equal(mp_parse(body, len, "xyz", parts, 8, &n, why, sizeof(why)), 0);
        assert_int_equal(n, cases[c].n_files + 1);
        unsigned char sel[8];
        size_t k = upl_select(parts, n, cases[c].threshold, sel);
        assert_int_equal(k, cases[c].out);
        if (!k)
            continue; /* the row keeps the body as it is */
        char shas[8][65];
        for (size_t i = 0; i < n; i++)
            crypto_sha256_hex(parts[i].data, parts[i].data_len, shas[i]);
        struct upl_ref refs[8];
        assert_int_equal(upl_refs_of(body, parts, n, sel, (const char(*)[65])shas, refs), k);
        char *stored = NULL;
        size_t slen = 0, cut = 0;
        assert_int_equal(upl_store_form(body, len, refs, k, &stored, &slen), 0);
        for (size_t i = 0; i < k; i++)
            cut += refs[i].size;
        /* The row holds the headers and the table, not the parts' contents. */
        assert_true(upl_is_stored_form(stored, slen));
        assert_true(slen < len - cut + UPL_MAGIC_LEN + 1 + k * 110);
        assert_non_null(memmem(stored, slen, "filename=\"f0.png\"", 17));
        assert_non_null(memmem(stored, slen, "a red boat", 10));
        /* Read back: the same references, and the client's bytes exactly. */
        struct upl_ref got[8];
        size_t gn = 0, at = 0, total = 0;
        assert_int_equal(upl_parse(stored, slen, got, 8, &gn, &at, &total, 1u << 30), 0);
        assert_int_equal(gn, k);
        assert_int_equal(total, len);
        for (size_t i = 0; i < k; i++) {
            assert_int_equal(got[i].offset, refs[i].offset);
            assert_int_equal(got[i].size, refs[i].size);
            assert_string_equal(got[i].sha256, refs[i].sha256);
        }
        char *out = malloc(total);
        struct objects o = {.parts = parts, .n = n};
        assert_int_equal(upl_expand(stored, slen, got, gn, at, out, total, fetch, &o), 0);
        assert_memory_equal(out, body, len);
        /* A part that cannot be read: its reason, nothing more fetched. */
        struct objects bad = {.parts = parts, .n = n, .fail = UPL_UNAVAILABLE, .fail_at = 1};
        assert_int_equal(upl_expand(stored, slen, got, gn, at, out, total, fetch, &bad),
                         UPL_UNAVAILABLE);
        assert_int_equal(bad.calls, 1);
        free(out);
        free(stored);
    }
    free(body);
}

static void test_store_form_refuses_bad_refs(void **state)
{
    (void)state;
    static const char body[] = "0123456789abcdefghij";
    static const struct {
        struct upl_ref refs[2];
        size_t n;
    } cases[] = {
        {{{5, 16, SHA_B}}, 1},                   /* beyond the body */
        {{{2, 5, SHA_B}, {6, 2, SHA_B}}, 2},     /* overlapping */
        {{{8, 2, SHA_B}, {2, 2, SHA_B}}, 2},     /* not ascending */
        {{{2, 2, "ABC"}}, 1},                    /* not a digest */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *out = (char *)1;
        size_t len = 1;
        assert_int_equal(upl_store_form(body, 20, cases[i].refs, cases[i].n, &out, &len), -1);
        assert_null(out);
    }
}

static void test_parse_is_strict(void **state)
{
    (void)state;
#define M "idemgate-upload/1\n"
#define L(o, s) #o " " #s " " SHA_B "\n"
    static const struct {
        const char *stored;
        int ok;
        size_t total;
    } cases[] = {
        {M L(2, 3) "\n" "ab" "cd", 1, 7},
        {M L(0, 3) L(3, 1) "\n" "", 1, 4},       /* two objects back to back */
        {M L(2, 3) "\n" "a", 0, 0},              /* the reference lies beyond the body */
        {M L(2, 3), 0, 0},                       /* no end of the table */
        {M "\n" "abc", 0, 0},                    /* a table that names nothing */
        {M L(02, 3) "\n" "abcd", 0, 0},          /* a leading zero */
        {M "2  3 " SHA_B "\n\nab", 0, 0},        /* two spaces */
        {M "2 3 " SHA_B "x\n\nab", 0, 0},        /* a longer digest */
        {M "2 3 " SHA_A "\n\nab", 0, 0},         /* 68 digits */
        {M "2 3 BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB\n\nab", 0, 0},
        {M L(2, 3) L(4, 1) "\n" "abcdefg", 0, 0}, /* overlapping */
        {M L(4, 1) L(2, 1) "\n" "abcdefg", 0, 0}, /* not ascending */
        {M "99999999999999999999999 1 " SHA_B "\n\nab", 0, 0}, /* overflows */
        {"idemgate-upload/2\n" L(2, 3) "\n" "ab", 0, 0},
        {"--xyz\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nb\r\n--xyz--\r\n", 0, 0},
        {"{\"prompt\": \"idemgate-upload/1\"}", 0, 0},
        {M L(2, 2000) "\n" "ab", 0, 0},          /* over the largest body taken (1000 here) */
    };
#undef L
#undef M
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct upl_ref refs[4];
        size_t n = 0, at = 0, total = 0;
        print_message("%zu\n", i);
        int rc = upl_parse(cases[i].stored, strlen(cases[i].stored), refs, 4, &n, &at, &total,
                           1000);
        assert_int_equal(rc, cases[i].ok ? 0 : -1);
        if (cases[i].ok)
            assert_int_equal(total, cases[i].total);
    }
    /* More references than the reader takes. */
    char many[8192] = "idemgate-upload/1\n";
    for (int i = 0; i < 5; i++)
        snprintf(many + strlen(many), sizeof(many) - strlen(many), "%d 1 %s\n", i * 2, SHA_B);
    strcat(many, "\nabcdefghij");
    struct upl_ref refs[5];
    size_t n, at, total;
    assert_int_equal(upl_parse(many, strlen(many), refs, 4, &n, &at, &total, 1000), -1);
    assert_int_equal(upl_parse(many, strlen(many), refs, 5, &n, &at, &total, 1000), 0);
    assert_int_equal(total, 15);
}

static void test_unread_next(void **state)
{
    (void)state;
    static const struct {
        enum upl_unread why;
        int ambiguous;
        long long since_ms, deadline_ms;
        enum op_state want;
    } cases[] = {
        /* The store cannot be read: wait for it, however long; nothing was sent. */
        {UPL_UNAVAILABLE, 0, 0, 900000, ST_PREPARED},
        {UPL_UNAVAILABLE, 0, 10000000, 900000, ST_PREPARED},
        {UPL_UNAVAILABLE, 1, 10000000, 900000, ST_PREPARED},
        /* Missing: waited for within the provider's deadline (restored, or shared late). */
        {UPL_MISSING, 0, 0, 900000, ST_PREPARED},
        {UPL_MISSING, 1, 899999, 900000, ST_PREPARED},
        /* Gone for good: never sent as recorded; failed only when no task can exist. */
        {UPL_MISSING, 0, 900000, 900000, ST_FAILED},
        {UPL_MISSING, 1, 900000, 900000, ST_UNKNOWN},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(upl_unread_next(cases[i].why, cases[i].ambiguous, cases[i].since_ms,
                                         cases[i].deadline_ms),
                         cases[i].want);
}

static void test_resend_blocked(void **state)
{
    (void)state;
    static const struct {
        int rc;
        enum op_state want;
    } cases[] = {
        {UPL_UNAVAILABLE, ST_UNKNOWN}, /* waits for the store: no attempt spent */
        {UPL_MISSING, ST_UNKNOWN},     /* another replica's store may hold it */
        {-1, ST_REVIEW},               /* never sendable as recorded: an operator */
        {-7, ST_REVIEW},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        enum op_state got = upl_resend_blocked(cases[i].rc);
        assert_int_equal(got, cases[i].want);
        assert_int_not_equal(got, ST_FAILED); /* a task may exist */
        assert_int_not_equal(got, ST_PREPARED);
    }
    assert_string_equal(upl_unread_reason(UPL_UNAVAILABLE), "store_unavailable");
    assert_string_equal(upl_unread_reason(UPL_MISSING), "object_missing");
    assert_string_equal(upl_unread_reason(-1), "malformed");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_select),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_store_form_refuses_bad_refs),
        cmocka_unit_test(test_parse_is_strict),
        cmocka_unit_test(test_unread_next),
        cmocka_unit_test(test_resend_blocked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
