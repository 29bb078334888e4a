/* libFuzzer harness: the request header parsers of src/headers.c (Idempotency-Key, bearer token,
 * Prefer). The whole input is one header value, in a buffer of exactly its length plus the NUL
 * that libmicrohttpd gives, so AddressSanitizer reports any read past the value.
 *
 * Properties checked:
 * - a key is 1..255 printable ASCII characters; the bare form is the value itself; written back
 *   as an RFC 8941 string it parses to the same key;
 * - a bearer token lies inside the value, is visible ASCII, and is what follows the scheme;
 * - a wait preference is in 0..cap. */
#include "fuzz.h"

#include "idemgate/headers.h"

#include <strings.h>

static void check_key(const char *value, size_t len)
{
    char out[HDR_KEY_MAX + 1], again[HDR_KEY_MAX + 1];
    char quoted[2 * HDR_KEY_MAX + 3];
    int n = hdr_idempotency_key(value, len, out);
    if (n < 0) {
        FZ_CHECK(n == -1, "refusal is -1");
        return;
    }
    FZ_CHECK(n >= 1 && n <= HDR_KEY_MAX, "key length 1..255");
    FZ_CHECK(out[n] == '\0' && strlen(out) == (size_t)n, "key NUL-terminated at its length");
    for (int i = 0; i < n; i++)
        FZ_CHECK(out[i] >= 0x20 && out[i] <= 0x7e, "key is printable ASCII");
    FZ_CHECK(memchr(value, '\0', len) == NULL, "a value holding a NUL is refused");
    if (value[0] != '"')
        FZ_CHECK((size_t)n == len && memcmp(out, value, len) == 0, "bare key is the value");
    else
        FZ_CHECK((size_t)n <= len - 2, "quoted key shorter than its quotes");
    /* Round trip through the sf-string form. */
    size_t q = 0;
    quoted[q++] = '"';
    for (int i = 0; i < n; i++) {
        if (out[i] == '"' || out[i] == '\\')
            quoted[q++] = '\\';
        quoted[q++] = out[i];
    }
    quoted[q++] = '"';
    quoted[q] = '\0';
    FZ_CHECK(hdr_idempotency_key(quoted, q, again) == n && memcmp(again, out, (size_t)n) == 0,
             "a key written as an sf-string reads back the same");
}

static void check_bearer(const char *value, size_t len)
{
    size_t tlen = 0;
    const char *t = hdr_bearer(value, &tlen);
    if (!t)
        return;
    FZ_CHECK(len >= 8 && strncasecmp(value, "Bearer ", 7) == 0, "only the Bearer scheme");
    FZ_CHECK(t >= value + 7 && tlen >= 1 && t + tlen <= value + len, "token inside the value");
    for (size_t i = 0; i < tlen; i++)
        FZ_CHECK(t[i] > 0x20 && t[i] < 0x7f, "token is visible ASCII");
    for (const char *p = value + 7; p < t; p++)
        FZ_CHECK(*p == ' ', "only spaces before the token");
    for (const char *p = t + tlen; *p; p++)
        FZ_CHECK(*p == ' ', "only spaces after the token");
}

static void check_prefer(const char *value)
{
    static const int caps[] = {0, 1, 60, 2147483647};
    for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++) {
        int w = hdr_prefer_wait(value, caps[i]);
        FZ_CHECK(w >= 0 && w <= caps[i], "wait in 0..cap");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The key parser takes the value with its length, NULs included; the other parsers take
     * values as libmicrohttpd hands them over, ending at their first NUL. */
    char *whole = fz_strndup(data, size);
    check_key(whole, size);
    free(whole);
    const uint8_t *nul = memchr(data, '\0', size);
    size_t len = nul ? (size_t)(nul - data) : size;
    char *value = fz_strndup(data, len);
    check_bearer(value, len);
    check_prefer(value);
    free(value);
    return 0;
}
