#include "idemgate/fingerprint.h"

#include <string.h>

void fp_compute(const char *provider, size_t plen, const char *route, size_t rlen,
                const char *canonical, size_t clen, char out_hex[CRYPTO_SHA256_HEX])
{
    static const char tag[] = "idemgate-fingerprint-v1";
    struct crypto_sha256 h;
    uint8_t d[CRYPTO_SHA256_LEN];
    if (crypto_sha256_begin(&h) < 0) {
        out_hex[0] = '\0'; /* never equal to a stored fingerprint: the caller answers 500 */
        return;
    }
    crypto_sha256_update(&h, tag, sizeof(tag)); /* includes the NUL separator */
    crypto_sha256_update(&h, provider, plen);
    crypto_sha256_update(&h, "", 1);
    crypto_sha256_update(&h, route, rlen);
    crypto_sha256_update(&h, "", 1);
    crypto_sha256_update(&h, canonical, clen);
    crypto_sha256_end(&h, d);
    crypto_hex(d, sizeof(d), out_hex);
}

const char *fp_mismatch(const char *stored_provider, const char *stored_route,
                        const char *provider, const char *route)
{
    if (strcmp(stored_provider ? stored_provider : "", provider ? provider : "") != 0)
        return "provider";
    if (strcmp(stored_route ? stored_route : "", route ? route : "") != 0)
        return "route";
    return "body";
}
