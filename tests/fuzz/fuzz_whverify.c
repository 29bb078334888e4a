/* libFuzzer harness: webhook signature parsing and verification (src/whverify.c).
 *
 * Input lines: the event id, the timestamp, the signature header(s), the secret (or public key),
 * then the body (the rest). Every scheme is first run on the input as it is: nothing may crash,
 * and a delivery is accepted only when the signature really matches. Then the harness signs
 * the same id and body itself, correctly, and checks that each scheme accepts it:
 * - Standard Webhooks, with the correct "v1,…" entry appended after the input's own entries
 *   (so any way the entry list is split, skipped or over-read shows up as a refusal), and with
 *   one more byte of body it is refused;
 * - hex HMAC-SHA256 in lower case, upper case and with the "sha256=" prefix;
 * - Ed25519 (a key pair made at start) over "{request id}\n{user id}\n{timestamp}\n{sha256}". */
#include "fuzz.h"

#include "idemgate/crypto.h"
#include "idemgate/whverify.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <strings.h>

#define NOW 1614265330LL /* the time of the published Standard Webhooks test vector */

static EVP_PKEY *ed_key;
static char ed_pub_b64[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    unsigned char seed[32], pub[32];
    size_t publen = sizeof(pub);
    for (int i = 0; i < 32; i++)
        seed[i] = (unsigned char)(i * 7 + 1);
    ed_key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, sizeof(seed));
    if (!ed_key || EVP_PKEY_get_raw_public_key(ed_key, pub, &publen) != 1 || publen != 32)
        abort();
    EVP_EncodeBlock((unsigned char *)ed_pub_b64, pub, 32);
    return 0;
}

struct hdrs {
    const char *id, *ts, *sig, *user;
};

static const char *hdr(const char *name, void *arg)
{
    const struct hdrs *h = arg;
    if (!strcasecmp(name, "webhook-id") || !strcasecmp(name, "X-Fal-Webhook-Request-Id"))
        return h->id;
    if (!strcasecmp(name, "webhook-timestamp") || !strcasecmp(name, "X-Fal-Webhook-Timestamp"))
        return h->ts;
    if (!strcasecmp(name, "X-Fal-Webhook-User-Id"))
        return h->user;
    if (!strcasecmp(name, "webhook-signature") || !strcasecmp(name, "X-Signature") ||
        !strcasecmp(name, "X-Fal-Webhook-Signature"))
        return h->sig;
    return NULL;
}

static void check_standard(const struct fz_parts *in)
{
    /* The key: 32 bytes derived from the input's secret line, as a whsec_ secret. */
    unsigned char key[32], mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    char secret[6 + 45], ts[24], mac_b64[45];
    crypto_sha256(in->part[3], in->len[3], key);
    memcpy(secret, "whsec_", 6);
    EVP_EncodeBlock((unsigned char *)secret + 6, key, 32);
    snprintf(ts, sizeof(ts), "%lld", NOW);
    size_t idl = strlen(in->part[0]), tsl = strlen(ts), ml = idl + tsl + 2 + in->len[4];
    unsigned char *signed_text = malloc(ml + 1);
    if (!signed_text)
        abort();
    memcpy(signed_text, in->part[0], idl);
    signed_text[idl] = '.';
    memcpy(signed_text + idl + 1, ts, tsl);
    signed_text[idl + 1 + tsl] = '.';
    memcpy(signed_text + idl + 2 + tsl, in->part[4], in->len[4]);
    if (!HMAC(EVP_sha256(), key, 32, signed_text, ml, mac, &mac_len))
        abort();
    free(signed_text);
    EVP_EncodeBlock((unsigned char *)mac_b64, mac, (int)mac_len);
    size_t n = strlen(in->part[2]) + 64;
    char *sigs = malloc(n);
    if (!sigs)
        abort();
    snprintf(sigs, n, "%s v1,%s", in->part[2], mac_b64);
    struct hdrs h = {in->part[0], ts, sigs, NULL};
    FZ_CHECK(wh_verify_standard(hdr, &h, in->part[4], in->len[4], secret, NOW) == 0,
             "a correct Standard Webhooks signature after any other entries is accepted");
    FZ_CHECK(wh_verify_standard(hdr, &h, in->part[4], in->len[4], secret, NOW + 301) != 0,
             "a stale timestamp is refused");
    /* One more byte of body: the signature no longer matches (the body buffer has its NUL). */
    FZ_CHECK(wh_verify_standard(hdr, &h, in->part[4], in->len[4] + 1, secret, NOW) != 0,
             "a changed body is refused");
    free(sigs);
}

static void check_hmac_hex(const struct fz_parts *in)
{
    const char *secret = in->part[3];
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    if (!*secret)
        return;
    if (!HMAC(EVP_sha256(), secret, (int)strlen(secret), (const unsigned char *)in->part[4],
              in->len[4], mac, &mac_len))
        abort();
    char hex[2 * EVP_MAX_MD_SIZE + 1], sig[2 * EVP_MAX_MD_SIZE + 8];
    crypto_hex(mac, mac_len, hex);
    snprintf(sig, sizeof(sig), "sha256=%s", hex);
    struct hdrs h = {NULL, NULL, hex, NULL};
    FZ_CHECK(wh_verify_hmac_hex(hdr, &h, NULL, in->part[4], in->len[4], secret) == 0,
             "a correct hex HMAC is accepted");
    h.sig = sig;
    FZ_CHECK(wh_verify_hmac_hex(hdr, &h, NULL, in->part[4], in->len[4], secret) == 0,
             "a correct sha256= HMAC is accepted");
    for (char *p = hex; *p; p++)
        if (*p >= 'a' && *p <= 'f')
            *p = (char)(*p - 'a' + 'A');
    h.sig = hex;
    FZ_CHECK(wh_verify_hmac_hex(hdr, &h, NULL, in->part[4], in->len[4], secret) == 0,
             "an upper-case hex HMAC is accepted");
}

static void check_ed25519(const struct fz_parts *in)
{
    char digest[CRYPTO_SHA256_HEX], ts[24];
    crypto_sha256_hex(in->part[4], in->len[4], digest);
    snprintf(ts, sizeof(ts), "%lld", NOW);
    size_t n = strlen(in->part[0]) + strlen(in->part[3]) + 128;
    char *msg = malloc(n);
    if (!msg)
        abort();
    int mlen = snprintf(msg, n, "%s\n%s\n%s\n%s", in->part[0], in->part[3], ts, digest);
    unsigned char sigb[64];
    size_t siglen = sizeof(sigb);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestSignInit(ctx, NULL, NULL, NULL, ed_key) != 1 ||
        EVP_DigestSign(ctx, sigb, &siglen, (const unsigned char *)msg, (size_t)mlen) != 1)
        abort();
    EVP_MD_CTX_free(ctx);
    char hex[129];
    crypto_hex(sigb, 64, hex);
    struct hdrs h = {in->part[0], ts, hex, in->part[3]};
    FZ_CHECK(wh_verify_ed25519(hdr, &h, in->part[4], in->len[4], ed_pub_b64, NOW) == 0,
             "a correct Ed25519 signature is accepted");
    FZ_CHECK(wh_verify_ed25519(hdr, &h, in->part[4], in->len[4], ed_pub_b64, NOW - 301) != 0,
             "a stale Ed25519 timestamp is refused");
    free(msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_parts in;
    fz_split(data, size, 5, &in);
    struct hdrs h = {in.part[0], in.part[1], in.part[2], in.part[0]};
    const char *body = in.part[4];
    size_t len = in.len[4];
    /* The input as it is: any answer, but no crash, no read past a header or the body. */
    (void)wh_verify_standard(hdr, &h, body, len, in.part[3], NOW);
    (void)wh_verify_hmac_hex(hdr, &h, NULL, body, len, in.part[3]);
    (void)wh_verify_hmac_hex(hdr, &h, "X-Signature", body, len, "");
    (void)wh_verify_ed25519(hdr, &h, body, len, in.part[3], NOW);
    check_standard(&in);
    check_hmac_hex(&in);
    check_ed25519(&in);
    fz_parts_free(&in);
    return 0;
}
