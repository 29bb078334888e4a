#include "idemgate/utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

size_t utf8_seq(const unsigned char *s, size_t avail)
{
    unsigned lo = 0x80, hi = 0xBF;
    size_t k;

    if (avail < 2)
        return 0;
    if (s[0] >= 0xC2 && s[0] <= 0xDF) {
        k = 2;
    } else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
        k = 3;
        if (s[0] == 0xE0)
            lo = 0xA0;
        else if (s[0] == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
        k = 4;
        if (s[0] == 0xF0)
            lo = 0x90;
        else if (s[0] == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (avail < k || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t j = 2; j < k; j++)
        if ((s[j] & 0xC0) != 0x80)
            return 0;
    return k;
}

int utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        /* ASCII eight bytes at a time: most of what is checked is ASCII throughout */
        uint64_t w;
        if (n - i >= 8 && (memcpy(&w, p + i, 8), (w & 0x8080808080808080ULL) == 0)) {
            i += 8;
            continue;
        }
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_seq(p + i, n - i);
        if (!k)
            return 0;
        i += k;
    }
    return 1;
}

char *utf8_repair(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    char *out = malloc(n * 3 + 1); /* each byte at worst becomes U+FFFD's three */
    size_t o = 0;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n;) {
        size_t k = p[i] < 0x80 ? 1 : utf8_seq(p + i, n - i);
        if (k) {
            memcpy(out + o, p + i, k);
            o += k;
            i += k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    out[o] = '\0';
    return out;
}

void utf8_trim_cut(char *s)
{
    size_t n = strlen(s), i = n;
    /* the start of the last sequence: at most three continuation bytes back */
    while (i > 0 && n - i < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80)
        i--;
    if (i == 0 || (unsigned char)s[i - 1] < 0xC0)
        return; /* ends on ASCII, or only continuation bytes: nothing to cut */
    i--;
    if (utf8_seq((const unsigned char *)s + i, n - i) != n - i)
        s[i] = '\0';
}
