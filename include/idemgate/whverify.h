#ifndef IDEMGATE_WHVERIFY_H
#define IDEMGATE_WHVERIFY_H

#include <stddef.h>

/* Webhook signature verification (OpenSSL), per scheme. Pure but for the crypto: the caller
 * passes the headers through a lookup function, the raw body, the secret and the time (the
 * database's: see wh_timestamp_fresh). Every comparison is constant-time. */

#define WH_TOLERANCE_S 300 /* a signed timestamp may be this far from now, either way */

/* Whether a signed timestamp (decimal Unix seconds, nothing else) lies within WH_TOLERANCE_S of
 * now, either way: 1 or 0. `now` is the database's clock, never this host's (a replica whose
 * clock is off would otherwise refuse fresh deliveries or accept replayed ones), the clock
 * leases are judged by. Pure. */
int wh_timestamp_fresh(const char *ts, long long now);

/* Returns the value of a request header (case-insensitive name), or NULL. */
typedef const char *(*wh_header_fn)(const char *name, void *arg);

/* The clock a signed timestamp is judged by (the database's): 0 and *now, or -1 when it cannot
 * be read. The *_at verifiers read it only once the signature verified, so a delivery nobody
 * signed costs no read of it (a database round trip); they answer 0, -1 (refused) or WH_ECLOCK
 * (the signature verified, the clock could not be read: neither accepted nor refused). The
 * verifiers without _at take the clock's value. */
typedef int (*wh_clock_fn)(void *ctx, long long *now);
#define WH_ECLOCK (-2)

/* Standard Webhooks: HMAC-SHA256 over "{webhook-id}.{webhook-timestamp}.{body}" with the
 * base64-decoded part of a "whsec_…" secret; `webhook-signature` holds space-separated
 * "v1,<base64>" entries, any of which may match. 0 when valid, -1 otherwise. */
int wh_verify_standard(wh_header_fn hdr, void *arg, const char *body, size_t len,
                       const char *secret, long long now);
int wh_verify_standard_at(wh_header_fn hdr, void *arg, const char *body, size_t len,
                          const char *secret, wh_clock_fn clock, void *clock_ctx);

/* Hex HMAC-SHA256 of the raw body in `header` (an optional "sha256=" prefix is accepted). */
int wh_verify_hmac_hex(wh_header_fn hdr, void *arg, const char *header, const char *body,
                       size_t len, const char *secret);

/* fal-style Ed25519: the signature (hex) in X-Fal-Webhook-Signature over
 * "{request-id}\n{user-id}\n{timestamp}\n{hex sha256(body)}"; public_keys is one raw 32-byte key
 * or several (separated by commas or white space: a JWKS's keys while they rotate), each in
 * standard base64 with its padding or in base64url without it (a JWK's "x"); one that verifies
 * is enough. */
int wh_verify_ed25519(wh_header_fn hdr, void *arg, const char *body, size_t len,
                      const char *public_keys, long long now);
int wh_verify_ed25519_at(wh_header_fn hdr, void *arg, const char *body, size_t len,
                         const char *public_keys, wh_clock_fn clock, void *clock_ctx);

#endif
