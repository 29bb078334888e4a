/* For the differential check against another RFC 8785 implementation (tests/fuzz/diff_jcs.mjs):
 * prints, for each file named on the command line, "path<TAB>base64 of its canonical form" when
 * jcs_canonicalize accepts it, or "path<TAB>-" when it refuses it. Depth as the gateway's
 * default (64). */
#include "idemgate/jcs.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *nb = realloc(buf, cap *= 2);
        if (!nb)
            free(buf);
        buf = nb;
    }
    fclose(f);
    *len = n;
    return buf;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        size_t len = 0, clen = 0;
        char *in = slurp(argv[i], &len), *canon = NULL;
        if (!in)
            continue;
        if (jcs_canonicalize(in, len, 64, &canon, &clen, NULL) == 0) {
            unsigned char *b64 = malloc(4 * (clen / 3 + 1) + 1);
            if (!b64)
                return 1;
            EVP_EncodeBlock(b64, (const unsigned char *)canon, (int)clen);
            printf("%s\t%s\n", argv[i], b64);
            free(b64);
        } else {
            printf("%s\t-\n", argv[i]);
        }
        free(canon);
        free(in);
    }
    return 0;
}
