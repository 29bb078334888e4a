#ifndef IDEMGATE_CRYPTO_H
#define IDEMGATE_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

/* Thin wrappers over OpenSSL: hashing, randomness, identifiers, constant-time comparison. */

#define CRYPTO_SHA256_LEN 32
#define CRYPTO_SHA256_HEX 65 /* 64 hex digits and a NUL */

/* A running SHA-256. */
struct crypto_sha256 {
    void *md_ctx;
};

__attribute__((warn_unused_result)) int crypto_sha256_begin(struct crypto_sha256 *h);
void crypto_sha256_update(struct crypto_sha256 *h, const void *p, size_t len);
/* Writes the digest and frees the context. */
void crypto_sha256_end(struct crypto_sha256 *h, uint8_t out[CRYPTO_SHA256_LEN]);

/* One-shot SHA-256 of (p, len). */
void crypto_sha256(const void *p, size_t len, uint8_t out[CRYPTO_SHA256_LEN]);
/* One-shot SHA-256 of (p, len) as 64 lowercase hex digits and a NUL. */
void crypto_sha256_hex(const void *p, size_t len, char out[CRYPTO_SHA256_HEX]);

/* Lowercase hex of (p, len) into out, which holds 2*len+1 bytes. */
void crypto_hex(const uint8_t *p, size_t len, char *out);

/* Fills p with len bytes from OpenSSL's CSPRNG; returns 0 or -1. */
__attribute__((warn_unused_result)) int crypto_random(void *p, size_t len);

/* A new job id: "job_" and 26 lowercase base32 characters — the instant it is made (Unix
 * milliseconds, 50 bits in 10 characters, most significant first) then 80 random bits — so the
 * ids made in a second share their first characters and land together in the indexes that name
 * them (the primary key, the id's): an intake into a long history touches a few hot pages of
 * each, not a random page of millions (a new id's leaf was a cache miss and, after each
 * checkpoint, a full page in the WAL). Nothing reads the instant back: created_at is the job's
 * time. out holds 31. */
#define CRYPTO_JOB_ID_LEN 31
#define CRYPTO_JOB_ID_TIME_CHARS 10
__attribute__((warn_unused_result)) int crypto_job_id(char out[CRYPTO_JOB_ID_LEN]);
/* The same for the instant ms (tests). */
__attribute__((warn_unused_result)) int crypto_job_id_at(long long ms, char out[CRYPTO_JOB_ID_LEN]);

/* A new tenant token: "igt_" and 43 base64url characters (256 random bits); out holds 48. */
#define CRYPTO_TOKEN_LEN 48
__attribute__((warn_unused_result)) int crypto_token(char out[CRYPTO_TOKEN_LEN]);

/* 1 when the two buffers are equal, compared in time independent of their contents. */
int crypto_ct_equal(const void *a, const void *b, size_t len);

#endif
