#include "idemgate/whverify.h"

#include "idemgate/crypto.h"

#include <errno.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Decodes standard base64 (padding required) into out; returns the length or -1. */
static int b64_decode(const char *in, size_t len, unsigned char *out, size_t cap)
{
    if (len == 0 || len % 4 || (len / 4) * 3 > cap)
        return -1;
    int n = EVP_DecodeBlock(out, (const unsigned char *)in, (int)len);
    if (n < 0)
        return -1;
    if (in[len - 1] == '=')
        n--;
    if (in[len - 2] == '=')
        n--;
    return n;
}

/* A signed timestamp's value: one decimal number of a long long and nothing else. 0 and *t,
 * or -1. */
static int ts_parse(const char *ts, long long *t)
{
    char *end;
    if (!ts || !*ts)
        return -1;
    errno = 0;
    *t = strtoll(ts, &end, 10);
    return *end != '\0' || errno == ERANGE ? -1 : 0;
}

int wh_timestamp_fresh(const char *ts, long long now)
{
    long long t;
    if (ts_parse(ts, &t) < 0)
        return 0;
    /* Compared with t on its own side: now - t overflows for a t near LLONG_MIN. now is a real
     * clock (the database's), far from the limits of a long long. */
    return t >= now - WH_TOLERANCE_S && t <= now + WH_TOLERANCE_S;
}

static int fixed_clock(void *ctx, long long *now)
{
    *now = *(const long long *)ctx;
    return 0;
}

/* A signature that verified: its timestamp judged by the clock, read only now. */
static int signed_at(const char *ts, wh_clock_fn clock, void *clock_ctx)
{
    long long now;
    if (clock(clock_ctx, &now) < 0)
        return WH_ECLOCK;
    return wh_timestamp_fresh(ts, now) ? 0 : -1;
}

/* A timestamp that cannot be fresh at any time: what wh_timestamp_fresh refuses whatever the
 * clock. */
static int ts_malformed(const char *ts)
{
    long long t;
    return ts_parse(ts, &t) < 0;
}

int wh_verify_standard(wh_header_fn hdr, void *arg, const char *body, size_t len,
                       const char *secret, long long now)
{
    return wh_verify_standard_at(hdr, arg, body, len, secret, fixed_clock, &now);
}

int wh_verify_standard_at(wh_header_fn hdr, void *arg, const char *body, size_t len,
                          const char *secret, wh_clock_fn clock, void *clock_ctx)
{
    const char *id = hdr("webhook-id", arg);
    const char *ts = hdr("webhook-timestamp", arg);
    const char *sigs = hdr("webhook-signature", arg);
    unsigned char key[256], mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    if (!id || !ts || !sigs || !secret || ts_malformed(ts))
        return -1;
    if (strncmp(secret, "whsec_", 6) == 0)
        secret += 6;
    int klen = b64_decode(secret, strlen(secret), key, sizeof(key));
    if (klen <= 0)
        return -1;
    /* HMAC over id.timestamp.body, fed in pieces so the body is not copied. */
    EVP_MAC *m = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = m ? EVP_MAC_CTX_new(m) : NULL;
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", "SHA256", 0),
                           OSSL_PARAM_construct_end()};
    size_t out_len = 0;
    int ok = ctx && EVP_MAC_init(ctx, key, (size_t)klen, params) == 1 &&
             EVP_MAC_update(ctx, (const unsigned char *)id, strlen(id)) == 1 &&
             EVP_MAC_update(ctx, (const unsigned char *)".", 1) == 1 &&
             EVP_MAC_update(ctx, (const unsigned char *)ts, strlen(ts)) == 1 &&
             EVP_MAC_update(ctx, (const unsigned char *)".", 1) == 1 &&
             EVP_MAC_update(ctx, (const unsigned char *)body, len) == 1 &&
             EVP_MAC_final(ctx, mac, &out_len, sizeof(mac)) == 1;
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(m);
    explicit_bzero(key, sizeof(key));
    if (!ok)
        return -1;
    mac_len = (unsigned int)out_len;
    /* Any "v1,<base64>" entry may match (secret rotation sends several). */
    const char *p = sigs;
    while (*p) {
        while (*p == ' ')
            p++;
        const char *e = strchr(p, ' ');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        unsigned char got[64];
        if (n > 3 && strncmp(p, "v1,", 3) == 0) {
            int glen = b64_decode(p + 3, n - 3, got, sizeof(got));
            if (glen == (int)mac_len && crypto_ct_equal(got, mac, mac_len))
                return signed_at(ts, clock, clock_ctx);
        }
        p += n;
    }
    return -1;
}

static int hex_decode(const char *s, size_t n, unsigned char *out, size_t cap)
{
    if (n % 2 || n / 2 > cap)
        return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v = 0;
        for (int k = 0; k < 2; k++) {
            char c = s[2 * i + (size_t)k];
            v <<= 4;
            if (c >= '0' && c <= '9')
                v |= (unsigned)(c - '0');
            else if (c >= 'a' && c <= 'f')
                v |= (unsigned)(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F')
                v |= (unsigned)(c - 'A' + 10);
            else
                return -1;
        }
        out[i] = (unsigned char)v;
    }
    return (int)(n / 2);
}

int wh_verify_hmac_hex(wh_header_fn hdr, void *arg, const char *header, const char *body,
                       size_t len, const char *secret)
{
    const char *sig = hdr(header ? header : "X-Signature", arg);
    unsigned char mac[EVP_MAX_MD_SIZE], got[64];
    unsigned int mac_len = 0;
    if (!sig || !secret || !*secret)
        return -1;
    if (strncasecmp(sig, "sha256=", 7) == 0)
        sig += 7;
    if (!HMAC(EVP_sha256(), secret, (int)strlen(secret), (const unsigned char *)body, len, mac,
              &mac_len))
        return -1;
    int glen = hex_decode(sig, strlen(sig), got, sizeof(got));
    return glen == (int)mac_len && crypto_ct_equal(got, mac, mac_len) ? 0 : -1;
}

int wh_verify_ed25519(wh_header_fn hdr, void *arg, const char *body, size_t len,
                      const char *public_keys, long long now)
{
    return wh_verify_ed25519_at(hdr, arg, body, len, public_keys, fixed_clock, &now);
}

/* One Ed25519 public key of a list: standard base64 with its padding, or base64url without it
 * (a JWK's "x", as fal's JWKS publishes it). 32 bytes into pub, or -1. */
static int ed25519_key(const char *in, size_t len, unsigned char pub[48])
{
    char k[64];
    if (len == 0 || len + 3 >= sizeof(k))
        return -1;
    for (size_t i = 0; i < len; i++)
        k[i] = in[i] == '-' ? '+' : in[i] == '_' ? '/' : in[i];
    while (len % 4)
        k[len++] = '=';
    k[len] = '\0';
    return b64_decode(k, len, pub, 48) == 32 ? 0 : -1;
}

static int ed25519_verifies(const unsigned char pub[32], const unsigned char sig[64],
                            const char *msg, size_t len)
{
    EVP_PKEY *key = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, pub, 32);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = key && ctx && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, key) == 1 &&
             EVP_DigestVerify(ctx, sig, 64, (const unsigned char *)msg, len) == 1;
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(key);
    return ok;
}

int wh_verify_ed25519_at(wh_header_fn hdr, void *arg, const char *body, size_t len,
                         const char *public_keys, wh_clock_fn clock, void *clock_ctx)
{
    const char *rid = hdr("X-Fal-Webhook-Request-Id", arg);
    const char *uid = hdr("X-Fal-Webhook-User-Id", arg);
    const char *ts = hdr("X-Fal-Webhook-Timestamp", arg);
    const char *sig = hdr("X-Fal-Webhook-Signature", arg);
    unsigned char pub[48], sigb[64];
    if (!rid || !uid || !ts || !sig || !public_keys || ts_malformed(ts))
        return -1;
    if (hex_decode(sig, strlen(sig), sigb, sizeof(sigb)) != 64)
        return -1;
    char digest[CRYPTO_SHA256_HEX];
    crypto_sha256_hex(body, len, digest);
    size_t mlen = strlen(rid) + strlen(uid) + strlen(ts) + 64 + 4;
    char *msg = malloc(mlen);
    if (!msg)
        return -1;
    int n = snprintf(msg, mlen, "%s\n%s\n%s\n%s", rid, uid, ts, digest);
    /* Each key of the list (separated by commas or white space: the keys of a JWKS while
     * the provider rotates them) is tried; one that verifies is enough. */
    int ok = 0;
    for (const char *p = public_keys; *p && !ok;) {
        p += strspn(p, ", \t\r\n");
        size_t k = strcspn(p, ", \t\r\n");
        if (k && ed25519_key(p, k, pub) == 0)
            ok = ed25519_verifies(pub, sigb, msg, (size_t)n);
        p += k;
    }
    free(msg);
    return ok ? signed_at(ts, clock, clock_ctx) : -1;
}
