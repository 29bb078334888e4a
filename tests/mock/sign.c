/*
 * idemgate-mock: the signatures real providers put on their webhooks (see sign.h).
 */
#include "sign.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/params.h>

/* Largest decoded Standard Webhooks key accepted; real secrets are 24 to 64 bytes. */
#define KEY_MAX 256

/* The configured secrets and the Ed25519 key pair; written only by sign_init(). */
static unsigned char webhook_key[KEY_MAX];
static size_t webhook_key_len;
static unsigned char hmac_key[KEY_MAX];
static size_t hmac_key_len;
static EVP_PKEY *ed25519_key;
static unsigned char ed25519_public[32];

/* Writes the lower-case hex of (in, len) into out, which holds 2 * len + 1 bytes. */
static void to_hex(const unsigned char *in, size_t len, char *out)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * len] = '\0';
}

/*
 * Decodes standard base64 (padding optional, no whitespace) into out (size bytes).  Stores
 * the decoded length in *out_len.  Returns false on a character outside the alphabet or when
 * out is too small.
 */
static bool base64_decode(const char *in, unsigned char *out, size_t size, size_t *out_len)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    unsigned int acc = 0, bits = 0;
    size_t n = 0;

    for (const char *p = in; *p && *p != '='; p++) {
        const char *pos = strchr(alphabet, *p);

        if (pos == NULL)
            return false;
        acc = (acc << 6) | (unsigned int)(pos - alphabet);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n == size)
                return false;
            out[n++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    *out_len = n;
    return true;
}

/* Writes the standard, padded base64 of (in, len) into out (4 * ((len + 2) / 3) + 1 bytes). */
static void base64_encode(const unsigned char *in, size_t len, char *out)
{
    EVP_EncodeBlock((unsigned char *)out, in, (int)len);
}

/*
 * Parses a Standard Webhooks secret: "whsec_" and base64, or bare base64 as some libraries
 * accept.  Returns false when it does not decode to 1..KEY_MAX bytes.
 */
static bool parse_webhook_secret(const char *secret)
{
    if (strncmp(secret, "whsec_", 6) == 0)
        secret += 6;
    return base64_decode(secret, webhook_key, sizeof(webhook_key), &webhook_key_len) &&
           webhook_key_len > 0;
}

/*
 * Makes the Ed25519 key: from a base64 32-byte seed when seed_b64 is set, else at random.
 * Returns false when the seed is malformed or OpenSSL failed.
 */
static bool make_ed25519_key(const char *seed_b64)
{
    unsigned char seed[64];
    size_t seed_len = 0, pub_len = sizeof(ed25519_public);

    if (seed_b64) {
        if (!base64_decode(seed_b64, seed, sizeof(seed), &seed_len) || seed_len != 32)
            return false;
        ed25519_key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, seed_len);
    } else {
        ed25519_key = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    }
    return ed25519_key != NULL &&
           EVP_PKEY_get_raw_public_key(ed25519_key, ed25519_public, &pub_len) == 1 &&
           pub_len == sizeof(ed25519_public);
}

/*
 * Reads MOCK_WEBHOOK_SECRET and MOCK_HMAC_SECRET (or their defaults) and makes the Ed25519
 * key pair: from MOCK_ED25519_PRIVATE_KEY (base64 of a 32-byte seed) when set, else a fresh
 * random one.  Call once, before any other thread exists.  Returns false after printing
 * why on stderr.
 */
bool sign_init(void)
{
    const char *whsec = getenv("MOCK_WEBHOOK_SECRET");
    const char *hmac = getenv("MOCK_HMAC_SECRET");

    if (whsec == NULL || *whsec == '\0')
        whsec = SIGN_DEFAULT_WEBHOOK_SECRET;
    if (hmac == NULL || *hmac == '\0')
        hmac = SIGN_DEFAULT_HMAC_SECRET;
    if (!parse_webhook_secret(whsec)) {
        fprintf(stderr, "idemgate-mock: MOCK_WEBHOOK_SECRET must be whsec_<base64>\n");
        return false;
    }
    hmac_key_len = strlen(hmac);
    if (hmac_key_len > sizeof(hmac_key)) {
        fprintf(stderr, "idemgate-mock: MOCK_HMAC_SECRET is longer than %d bytes\n", KEY_MAX);
        return false;
    }
    memcpy(hmac_key, hmac, hmac_key_len);
    if (!make_ed25519_key(getenv("MOCK_ED25519_PRIVATE_KEY"))) {
        fprintf(stderr, "idemgate-mock: cannot make the Ed25519 key (MOCK_ED25519_PRIVATE_KEY "
                        "must be the base64 of 32 bytes)\n");
        sign_shutdown();
        return false;
    }
    return true;
}

/* Frees the Ed25519 key; no other sign call may run concurrently. */
void sign_shutdown(void)
{
    EVP_PKEY_free(ed25519_key);
    ed25519_key = NULL;
}

/* HMAC-SHA256 of the concatenated parts under key into mac (32 bytes); false on failure. */
static bool hmac_parts(const unsigned char *key, size_t key_len, const char *const *parts,
                       const size_t *lens, size_t n, unsigned char mac[32])
{
    EVP_MAC *alg = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = alg ? EVP_MAC_CTX_new(alg) : NULL;
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string("digest", (char *)"SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    size_t out_len = 0;
    bool ok = ctx && EVP_MAC_init(ctx, key, key_len, params) == 1;

    for (size_t i = 0; ok && i < n; i++)
        ok = EVP_MAC_update(ctx, (const unsigned char *)parts[i], lens[i]) == 1;
    ok = ok && EVP_MAC_final(ctx, mac, &out_len, 32) == 1 && out_len == 32;
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(alg);
    return ok;
}

/* The Standard Webhooks signature with an explicit key, for the published test vector. */
static bool standard_with_key(const unsigned char *key, size_t key_len, const char *id,
                              const char *timestamp, const char *body, size_t body_len,
                              bool corrupt, char *out)
{
    const char *parts[] = {id, ".", timestamp, ".", body};
    const size_t lens[] = {strlen(id), 1, strlen(timestamp), 1, body_len};
    unsigned char mac[32];

    if (!hmac_parts(key, key_len, parts, lens, 5, mac))
        return false;
    if (corrupt)
        mac[0] ^= 0x01;
    memcpy(out, "v1,", 3);
    base64_encode(mac, sizeof(mac), out + 3);
    return true;
}

/*
 * Writes the Standard Webhooks signature "v1,<base64>" of (id, timestamp, body) under the
 * configured secret into out (SIGN_STANDARD_MAX bytes).  corrupt flips a bit of the MAC, so
 * the header is well formed but wrong.  Returns false when OpenSSL failed.
 */
bool sign_standard(const char *id, const char *timestamp, const char *body, size_t body_len,
                   bool corrupt, char *out)
{
    return standard_with_key(webhook_key, webhook_key_len, id, timestamp, body, body_len, corrupt,
                             out);
}

/*
 * Writes the lower-case hex HMAC-SHA256 of body under the configured hex HMAC secret into
 * out (SIGN_HMAC_HEX_MAX bytes); corrupt flips a bit.  Returns false when OpenSSL failed.
 */
bool sign_hmac_hex(const char *body, size_t body_len, bool corrupt, char *out)
{
    const char *parts[] = {body};
    unsigned char mac[32];

    if (!hmac_parts(hmac_key, hmac_key_len, parts, &body_len, 1, mac))
        return false;
    if (corrupt)
        mac[0] ^= 0x01;
    to_hex(mac, sizeof(mac), out);
    return true;
}

/* Signs msg with key into sig (64 bytes); false when OpenSSL failed. */
static bool ed25519_sign(EVP_PKEY *key, const unsigned char *msg, size_t len, unsigned char *sig)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    size_t sig_len = 64;
    bool ok = ctx && EVP_DigestSignInit(ctx, NULL, NULL, NULL, key) == 1 &&
              EVP_DigestSign(ctx, sig, &sig_len, msg, len) == 1 && sig_len == 64;

    EVP_MD_CTX_free(ctx);
    return ok;
}

/*
 * Writes the hex Ed25519 signature of fal's message for (request_id, user_id, timestamp,
 * body) into out (SIGN_ED25519_HEX_MAX bytes); corrupt flips a bit.  Returns false when
 * OpenSSL failed.
 */
bool sign_fal(const char *request_id, const char *user_id, const char *timestamp, const char *body,
              size_t body_len, bool corrupt, char *out)
{
    unsigned char digest[32], sig[64];
    unsigned int digest_len = 0;
    char digest_hex[65], *msg;
    int msg_len;
    bool ok;

    if (EVP_Digest(body, body_len, digest, &digest_len, EVP_sha256(), NULL) != 1)
        return false;
    to_hex(digest, sizeof(digest), digest_hex);
    msg_len = asprintf(&msg, "%s\n%s\n%s\n%s", request_id, user_id, timestamp, digest_hex);
    if (msg_len < 0)
        return false;
    ok = ed25519_sign(ed25519_key, (const unsigned char *)msg, (size_t)msg_len, sig);
    free(msg);
    if (!ok)
        return false;
    if (corrupt)
        sig[0] ^= 0x01;
    to_hex(sig, sizeof(sig), out);
    return true;
}

/* Writes the base64 of the raw 32-byte Ed25519 public key into out (SIGN_PUBLIC_KEY_B64_MAX). */
void sign_public_key_b64(char *out)
{
    base64_encode(ed25519_public, sizeof(ed25519_public), out);
}

/* Writes the base64url (no padding) of the raw public key, as a JWK "x" wants it. */
void sign_public_key_b64url(char *out)
{
    sign_public_key_b64(out);
    for (char *p = out; *p; p++) {
        if (*p == '+')
            *p = '-';
        else if (*p == '/')
            *p = '_';
        else if (*p == '=')
            *p = '\0';
    }
}

/* Parses 2 * len hex digits into out; false on anything else. */
static bool from_hex(const char *hex, unsigned char *out, size_t len)
{
    if (strlen(hex) != 2 * len)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned int v;

        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return false;
        out[i] = (unsigned char)v;
    }
    return true;
}

/* Prints a failed check and returns 1, or returns 0 when ok. */
static int check(bool ok, const char *name)
{
    if (!ok)
        printf("FAIL sign: %s\n", name);
    return ok ? 0 : 1;
}

/* The Standard Webhooks published test vector. */
static int test_standard_vector(void)
{
    const char *body = "{\"test\": 2432232314}";
    unsigned char key[KEY_MAX];
    size_t key_len = 0;
    char sig[SIGN_STANDARD_MAX];
    bool ok = base64_decode(&SIGN_DEFAULT_WEBHOOK_SECRET[6], key, sizeof(key), &key_len) &&
              standard_with_key(key, key_len, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", body,
                                strlen(body), false, sig) &&
              strcmp(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=") == 0;

    return check(ok, "Standard Webhooks test vector");
}

/* RFC 4231 test case 2 for HMAC-SHA256. */
static int test_hmac_vector(void)
{
    const char *data = "what do ya want for nothing?";
    const char *parts[] = {data};
    size_t len = strlen(data);
    unsigned char mac[32];
    char hex[65];
    bool ok = hmac_parts((const unsigned char *)"Jefe", 4, parts, &len, 1, mac);

    if (ok)
        to_hex(mac, sizeof(mac), hex);
    ok = ok && strcmp(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843") == 0;
    return check(ok, "HMAC-SHA256 RFC 4231 case 2");
}

/* RFC 8032 section 7.1 test 1 for Ed25519 (empty message). */
static int test_ed25519_vector(void)
{
    unsigned char seed[32], pub[32], sig[64], want[64];
    size_t pub_len = sizeof(pub);
    EVP_PKEY *key;
    bool ok =
        from_hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60", seed, 32) &&
        from_hex("e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33ba"
                 "cc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
                 want, 64);

    key = ok ? EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, 32) : NULL;
    ok = key && EVP_PKEY_get_raw_public_key(key, pub, &pub_len) == 1 &&
         ed25519_sign(key, (const unsigned char *)"", 0, sig) && memcmp(sig, want, 64) == 0;
    if (ok) {
        char pub_hex[65];

        to_hex(pub, 32, pub_hex);
        ok = strcmp(pub_hex, "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a") ==
             0;
    }
    EVP_PKEY_free(key);
    return check(ok, "Ed25519 RFC 8032 test 1");
}

/* The configured Ed25519 key signs fal's message and verifies with its public key. */
static int test_fal_roundtrip(void)
{
    const char *body = "{\"status\":\"OK\"}";
    char sig_hex[SIGN_ED25519_HEX_MAX], digest_hex[65], *msg = NULL;
    unsigned char sig[64], digest[32];
    unsigned int digest_len = 0;
    EVP_PKEY *pub = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, ed25519_public, 32);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int msg_len;
    bool ok = pub && ctx &&
              sign_fal("req_1", "mock", "1700000000", body, strlen(body), false, sig_hex) &&
              from_hex(sig_hex, sig, 64) &&
              EVP_Digest(body, strlen(body), digest, &digest_len, EVP_sha256(), NULL) == 1;

    if (ok) {
        to_hex(digest, 32, digest_hex);
        msg_len = asprintf(&msg, "req_1\nmock\n1700000000\n%s", digest_hex);
        ok = msg_len > 0 && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, pub) == 1 &&
             EVP_DigestVerify(ctx, sig, 64, (const unsigned char *)msg, (size_t)msg_len) == 1;
        free(msg);
    }
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(pub);
    return check(ok, "fal Ed25519 sign and verify");
}

/* Runs the known-answer checks; returns the number of failures and names each on stdout. */
int sign_self_test(void)
{
    return test_standard_vector() + test_hmac_vector() + test_ed25519_vector() +
           test_fal_roundtrip();
}
