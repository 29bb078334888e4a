/* Webhook signatures: the published Standard Webhooks vector, and every way to be refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "idemgate/crypto.h"
#include "idemgate/whverify.h"

struct hdrs {
    const char *names[6];
    const char *values[6];
};

static const char *lookup(const char *name, void *arg)
{
    struct hdrs *h = arg;
    for (int i = 0; i < 6 && h->names[i]; i++)
        if (strcasecmp(h->names[i], name) == 0)
            return h->values[i];
    return NULL;
}

#define SECRET "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#define BODY "{\"test\": 2432232314}"
#define SIG "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
#define TS 1614265330LL

static int standard(const char *id, const char *ts, const char *sig, const char *body,
                    const char *secret, long long now)
{
    struct hdrs h = {{"webhook-id", "webhook-timestamp", "webhook-signature"}, {id, ts, sig}};
    return wh_verify_standard(lookup, &h, body, strlen(body), secret, now);
}

static void test_standard_vector(void **state)
{
    (void)state;
    const char *id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    assert_int_equal(standard(id, "1614265330", SIG, BODY, SECRET, TS), 0);
    /* Several signatures (rotation): any one may match. */
    assert_int_equal(standard(id, "1614265330", "v1,AAAA " SIG, BODY, SECRET, TS), 0);
    assert_int_equal(standard(id, "1614265330", SIG, BODY, SECRET, TS + 299), 0);
    /* Refused: wrong secret, altered body, altered id, stale or future timestamp, no v1. */
    assert_int_equal(
        standard(id, "1614265330", SIG, BODY, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSx", TS), -1);
    assert_int_equal(standard(id, "1614265330", SIG, "{\"test\": 2432232315}", SECRET, TS), -1);
    assert_int_equal(standard("msg_other", "1614265330", SIG, BODY, SECRET, TS), -1);
    assert_int_equal(standard(id, "1614265330", SIG, BODY, SECRET, TS + 301), -1);
    assert_int_equal(standard(id, "1614265330", SIG, BODY, SECRET, TS - 301), -1);
    assert_int_equal(standard(id, "1614265330",
                              "v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", BODY, SECRET, TS),
                     -1);
    assert_int_equal(standard(id, "1614265330x", SIG, BODY, SECRET, TS), -1);
    assert_int_equal(standard(id, "1614265330", "", BODY, SECRET, TS), -1);
    assert_int_equal(standard(NULL, "1614265330", SIG, BODY, SECRET, TS), -1);
}

static void test_hmac_hex(void **state)
{
    (void)state;
    unsigned char mac[32];
    unsigned int n = 0;
    char hex[65], pref[80];
    HMAC(EVP_sha256(), "s3cret", 6, (const unsigned char *)BODY, strlen(BODY), mac, &n);
    crypto_hex(mac, n, hex);
    struct hdrs h = {{"X-Signature"}, {hex}};
    assert_int_equal(wh_verify_hmac_hex(lookup, &h, "X-Signature", BODY, strlen(BODY), "s3cret"),
                     0);
    snprintf(pref, sizeof(pref), "sha256=%s", hex);
    h.values[0] = pref;
    assert_int_equal(wh_verify_hmac_hex(lookup, &h, "X-Signature", BODY, strlen(BODY), "s3cret"),
                     0);
    assert_int_equal(wh_verify_hmac_hex(lookup, &h, "X-Signature", BODY, strlen(BODY), "other"),
                     -1);
    assert_int_equal(wh_verify_hmac_hex(lookup, &h, "X-Signature", "{}", 2, "s3cret"), -1);
    hex[0] = hex[0] == 'a' ? 'b' : 'a';
    h.values[0] = hex;
    assert_int_equal(wh_verify_hmac_hex(lookup, &h, "X-Signature", BODY, strlen(BODY), "s3cret"),
                     -1);
}

struct counting_clock {
    long long now;
    int fails, reads;
};

static int counting_clock(void *ctx, long long *now)
{
    struct counting_clock *c = ctx;
    c->reads++;
    *now = c->now;
    return c->fails ? -1 : 0;
}

static void test_ed25519(void **state)
{
    (void)state;
    EVP_PKEY *key = NULL;
    EVP_PKEY_CTX *kc = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, NULL);
    assert_true(kc && EVP_PKEY_keygen_init(kc) == 1 && EVP_PKEY_keygen(kc, &key) == 1);
    unsigned char pub[32], sig[64];
    size_t plen = sizeof(pub), slen = sizeof(sig);
    assert_int_equal(EVP_PKEY_get_raw_public_key(key, pub, &plen), 1);
    unsigned char pub_b64[64];
    EVP_EncodeBlock(pub_b64, pub, 32);
    char digest[65], msg[256], sighex[129];
    crypto_sha256_hex(BODY, strlen(BODY), digest);
    int n = snprintf(msg, sizeof(msg), "req_1\nuser_1\n1700000000\n%s", digest);
    EVP_MD_CTX *mc = EVP_MD_CTX_new();
    assert_int_equal(EVP_DigestSignInit(mc, NULL, NULL, NULL, key), 1);
    assert_int_equal(EVP_DigestSign(mc, sig, &slen, (unsigned char *)msg, (size_t)n), 1);
    crypto_hex(sig, 64, sighex);
    struct hdrs h = {{"X-Fal-Webhook-Request-Id", "X-Fal-Webhook-User-Id",
                      "X-Fal-Webhook-Timestamp", "X-Fal-Webhook-Signature"},
                     {"req_1", "user_1", "1700000000", sighex}};
    const char *pk = (const char *)pub_b64;
    assert_int_equal(wh_verify_ed25519(lookup, &h, BODY, strlen(BODY), pk, 1700000000), 0);
    assert_int_equal(wh_verify_ed25519(lookup, &h, "{}", 2, pk, 1700000000), -1);
    assert_int_equal(wh_verify_ed25519(lookup, &h, BODY, strlen(BODY), pk, 1700000000 + 301), -1);
    /* The clock is read only for a signature that verified (test_the_clock_is_read_only_…). */
    struct counting_clock c = {1700000000, 1, 0};
    assert_int_equal(wh_verify_ed25519_at(lookup, &h, "{}", 2, pk, counting_clock, &c), -1);
    assert_int_equal(c.reads, 0);
    assert_int_equal(wh_verify_ed25519_at(lookup, &h, BODY, strlen(BODY), pk, counting_clock, &c),
                     WH_ECLOCK);
    assert_int_equal(c.reads, 1);
    c.fails = 0;
    assert_int_equal(wh_verify_ed25519_at(lookup, &h, BODY, strlen(BODY), pk, counting_clock, &c),
                     0);
    /* The key as a JWK's "x" (base64url, no padding), and in a list beside another key (a
     * JWKS while it rotates): verified; a list of others only, or a key cut short: refused. */
    char url[64], list[200], others[200];
    snprintf(url, sizeof(url), "%s", pk);
    for (char *q = url; *q; q++)
        *q = *q == '+' ? '-' : *q == '/' ? '_' : *q;
    url[strcspn(url, "=")] = '\0';
    assert_int_equal(strlen(url), 43);
    assert_int_equal(wh_verify_ed25519(lookup, &h, BODY, strlen(BODY), url, 1700000000), 0);
    const char *other = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
    snprintf(list, sizeof(list), "%s, %s", other, url);
    assert_int_equal(wh_verify_ed25519(lookup, &h, BODY, strlen(BODY), list, 1700000000), 0);
    snprintf(list, sizeof(list), "%s\n%s", pk, other);
    assert_int_equal(wh_verify_ed25519(lookup, &h, BODY, strlen(BODY), list, 1700000000), 0);
    snprintf(others, sizeof(others), "%s,%s", other, other);
    assert_int_equal(wh_verify_ed25519(lookup, &h, BODY, strlen(BODY), others, 1700000000), -1);
    url[42] = '\0';
    assert_int_equal(wh_verify_ed25519(lookup, &h, BODY, strlen(BODY), url, 1700000000), -1);
    assert_int_equal(wh_verify_ed25519(lookup, &h, BODY, strlen(BODY), " , ", 1700000000), -1);
    h.values[0] = "req_2";
    assert_int_equal(wh_verify_ed25519(lookup, &h, BODY, strlen(BODY), pk, 1700000000), -1);
    EVP_MD_CTX_free(mc);
    EVP_PKEY_CTX_free(kc);
    EVP_PKEY_free(key);
}

/* The tolerance window, judged against the `now` given (the database's clock): a replica's own
 * clock never enters. Rows: timestamp header, now, fresh. */
struct ts_case {
    const char *ts;
    long long now;
    int fresh;
};

static const struct ts_case ts_cases[] = {
    {"1700000000", 1700000000LL, 1},
    {"1700000000", 1700000000LL + WH_TOLERANCE_S, 1},
    {"1700000000", 1700000000LL - WH_TOLERANCE_S, 1},
    {"1700000000", 1700000000LL + WH_TOLERANCE_S + 1, 0}, /* stale: a replay */
    {"1700000000", 1700000000LL - WH_TOLERANCE_S - 1, 0}, /* from the future */
    /* A delivery signed now, judged by a clock 400 s off either way: refused, which is why
     * the clock passed in is the database's and not a replica's. */
    {"1700000000", 1700000400LL, 0},
    {"1700000000", 1699999600LL, 0},
    {"", 1700000000LL, 0},
    {"17e8", 1700000000LL, 0},
    {"1700000000 ", 1700000000LL, 0},
    {" 1700000000", 1700000000LL, 1}, /* strtoll skips leading space; the signature covers it */
    {"-1", 0, 1},
    {"99999999999999999999", 1700000000LL, 0}, /* out of range: clamped, far from now */
    {"-9223372036854775808", 1700000000LL, 0}, /* no overflow in the comparison (UBSan) */
};

static void test_timestamp_tolerance(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(ts_cases) / sizeof(ts_cases[0]); i++)
        if (wh_timestamp_fresh(ts_cases[i].ts, ts_cases[i].now) != ts_cases[i].fresh)
            fail_msg("case %zu: ts \"%s\" now %lld: want fresh=%d", i, ts_cases[i].ts,
                     ts_cases[i].now, ts_cases[i].fresh);
    assert_int_equal(wh_timestamp_fresh(NULL, 0), 0);
    /* The published vector verifies by the clock it is given, whatever this host's says. */
    assert_int_equal(standard("msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", SIG, BODY, SECRET,
                              TS + WH_TOLERANCE_S),
                     0);
    assert_int_equal(standard("msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", SIG, BODY, SECRET,
                              TS + WH_TOLERANCE_S + 1),
                     -1);
}

/* The clock (the database's, a round trip) is read only once a signature verified: a delivery
 * nobody signed, signed wrongly or with a malformed timestamp costs no read. Rows: headers and
 * body, whether the clock can be read, the answer, how many times the clock was read. */
struct clock_case {
    const char *id, *ts, *sig, *body;
    int clock_fails;
    int want, reads;
};

static const struct clock_case clock_cases[] = {
    {"msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", SIG, BODY, 0, 0, 1},
    {"msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", SIG, BODY, 1, WH_ECLOCK, 1},
    {"msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", SIG, "{}", 0, -1, 0},
    {"msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", SIG, "{}", 1, -1, 0},
    {"msg_other", "1614265330", SIG, BODY, 1, -1, 0},
    {"msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", "v1,AAAA", BODY, 1, -1, 0},
    {"msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330x", SIG, BODY, 1, -1, 0},
    {"msg_p5jXN8AQM9LWM0D4loKWxJek", "99999999999999999999", SIG, BODY, 1, -1, 0},
    {NULL, "1614265330", SIG, BODY, 1, -1, 0},
};

static void test_the_clock_is_read_only_for_a_verified_signature(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(clock_cases) / sizeof(clock_cases[0]); i++) {
        const struct clock_case *k = &clock_cases[i];
        struct hdrs h = {{"webhook-id", "webhook-timestamp", "webhook-signature"},
                         {k->id, k->ts, k->sig}};
        struct counting_clock c = {TS, k->clock_fails, 0};
        int got = wh_verify_standard_at(lookup, &h, k->body, strlen(k->body), SECRET,
                                        counting_clock, &c);
        if (got != k->want || c.reads != k->reads)
            fail_msg("case %zu: answered %d with %d reads, want %d with %d", i, got, c.reads,
                     k->want, k->reads);
    }
    /* A verified signature whose timestamp the clock finds stale: refused, the clock read once. */
    struct hdrs h = {{"webhook-id", "webhook-timestamp", "webhook-signature"},
                     {"msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", SIG}};
    struct counting_clock c = {TS + WH_TOLERANCE_S + 1, 0, 0};
    assert_int_equal(
        wh_verify_standard_at(lookup, &h, BODY, strlen(BODY), SECRET, counting_clock, &c), -1);
    assert_int_equal(c.reads, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_standard_vector),
        cmocka_unit_test(test_hmac_hex),
        cmocka_unit_test(test_ed25519),
        cmocka_unit_test(test_timestamp_tolerance),
        cmocka_unit_test(test_the_clock_is_read_only_for_a_verified_signature),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
