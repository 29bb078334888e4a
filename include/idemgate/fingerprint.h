#ifndef IDEMGATE_FINGERPRINT_H
#define IDEMGATE_FINGERPRINT_H

#include "idemgate/crypto.h"

#include <stddef.h>

/* The request fingerprint: what makes two requests "the same intended operation". Version 1 is
 * SHA-256 over a domain tag, the provider, the route and the RFC 8785 canonical body, each
 * separated by a NUL (neither a provider nor a route can hold one). Stored with its version so a
 * later definition can coexist with rows written under this one. Any change of what goes in
 * (the canonical form included) is a new version: tests/unit/test_fingerprint.c pins this one. */
#define FP_VERSION 1

void fp_compute(const char *provider, size_t plen, const char *route, size_t rlen,
                const char *canonical, size_t clen, char out_hex[CRYPTO_SHA256_HEX]);

/* Which part of a request whose fingerprint differs from the stored operation's differs: the
 * "provider", else the "route", else the "body" (its canonical form, or the fingerprint's
 * version). For the 422 of a reused key. Pure; NULL compares as "". */
const char *fp_mismatch(const char *stored_provider, const char *stored_route,
                        const char *provider, const char *route);

#endif
