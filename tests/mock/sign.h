/*
 * idemgate-mock: the signatures real providers put on their webhooks.
 *
 * Three schemes, each as its provider documents it:
 *   Standard Webhooks (Replicate, OpenAI): webhook-signature "v1,<base64(HMAC-SHA256(key,
 *     id "." timestamp "." body))>", the key being the base64-decoded part of "whsec_...".
 *   Hex HMAC (Higgsfield/Argil style): lower-case hex HMAC-SHA256 of the raw body.
 *   Ed25519 (fal): a signature over request_id "\n" user_id "\n" timestamp "\n"
 *     hex(sha256(body)), sent as hex.
 * The keys are process-wide and set once by sign_init() before any thread uses them.
 */
#ifndef IDEMGATE_MOCK_SIGN_H
#define IDEMGATE_MOCK_SIGN_H

#include <stdbool.h>
#include <stddef.h>

/* Bytes a "v1,<base64>" Standard Webhooks signature needs, including the NUL. */
#define SIGN_STANDARD_MAX 64
/* Bytes a hex HMAC-SHA256 needs, including the NUL. */
#define SIGN_HMAC_HEX_MAX 65
/* Bytes a hex Ed25519 signature needs, including the NUL. */
#define SIGN_ED25519_HEX_MAX 129
/* Bytes the base64 of the raw 32-byte Ed25519 public key needs, including the NUL. */
#define SIGN_PUBLIC_KEY_B64_MAX 48

/* The Standard Webhooks secret used when MOCK_WEBHOOK_SECRET is unset. */
#define SIGN_DEFAULT_WEBHOOK_SECRET "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
/* The hex HMAC secret used when MOCK_HMAC_SECRET is unset. */
#define SIGN_DEFAULT_HMAC_SECRET "mock-hmac-secret"

/*
 * Reads MOCK_WEBHOOK_SECRET and MOCK_HMAC_SECRET (or their defaults) and makes the Ed25519
 * key pair: from MOCK_ED25519_PRIVATE_KEY (base64 of a 32-byte seed) when set, else a fresh
 * random one.  Call once, before any other thread exists.  Returns false after printing
 * why on stderr.
 */
bool sign_init(void);

/* Frees the Ed25519 key; no other sign call may run concurrently. */
void sign_shutdown(void);

/*
 * Writes the Standard Webhooks signature "v1,<base64>" of (id, timestamp, body) under the
 * configured secret into out (SIGN_STANDARD_MAX bytes).  corrupt flips a bit of the MAC, so
 * the header is well formed but wrong.  Returns false when OpenSSL failed.
 */
bool sign_standard(const char *id, const char *timestamp, const char *body, size_t body_len,
                   bool corrupt, char *out);

/*
 * Writes the lower-case hex HMAC-SHA256 of body under the configured hex HMAC secret into
 * out (SIGN_HMAC_HEX_MAX bytes); corrupt flips a bit.  Returns false when OpenSSL failed.
 */
bool sign_hmac_hex(const char *body, size_t body_len, bool corrupt, char *out);

/*
 * Writes the hex Ed25519 signature of fal's message for (request_id, user_id, timestamp,
 * body) into out (SIGN_ED25519_HEX_MAX bytes); corrupt flips a bit.  Returns false when
 * OpenSSL failed.
 */
bool sign_fal(const char *request_id, const char *user_id, const char *timestamp, const char *body,
              size_t body_len, bool corrupt, char *out);

/* Writes the base64 of the raw 32-byte Ed25519 public key into out (SIGN_PUBLIC_KEY_B64_MAX). */
void sign_public_key_b64(char *out);

/* Writes the base64url (no padding) of the raw public key, as a JWK "x" wants it. */
void sign_public_key_b64url(char *out);

/* Runs the known-answer checks; returns the number of failures and names each on stdout. */
int sign_self_test(void);

#endif
