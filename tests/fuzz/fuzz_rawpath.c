/* libFuzzer harness: rawpath_check (src/rawpath.c), which judges every request path as sent
 * before the router matches it (issue 21 item 9). The whole input is the path, in a buffer of
 * exactly its length plus a NUL, so AddressSanitizer reports any read past it.
 *
 * Properties checked:
 * - every verdict is a known, named one;
 * - an accepted path starts with '/', holds only visible ASCII other than '\', and every '%'
 *   starts an escape of two hex digits that decodes to visible ASCII other than '/' and '\';
 * - no segment of an accepted path decodes to "." or "..". */
#include "fuzz.h"

#include "idemgate/rawpath.h"

static int hex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
        return (c | 0x20) - 'a' + 10;
    return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *p = fz_strndup(data, size);
    enum rawpath_verdict v = rawpath_check(p, size);
    FZ_CHECK(v >= RAWPATH_OK && v <= RAWPATH_DOT_SEGMENT, "a known verdict");
    FZ_CHECK(strcmp(rawpath_verdict_name(v), "unknown") != 0, "every verdict is named");
    if (v == RAWPATH_OK) {
        FZ_CHECK(size > 0 && p[0] == '/', "an accepted path is origin-form");
        size_t seg = 1, dots = 0, other = 0;
        for (size_t i = 1; i <= size; i++) {
            if (i == size || p[i] == '/') {
                FZ_CHECK(other || dots == 0 || dots > 2, "no dot segment is accepted");
                seg = i + 1;
                dots = other = 0;
                continue;
            }
            unsigned char c = (unsigned char)p[i];
            FZ_CHECK(c > 0x20 && c < 0x7f && c != '\\', "only visible ASCII, no backslash");
            if (c == '%') {
                FZ_CHECK(i + 2 < size && hex(p[i + 1]) >= 0 && hex(p[i + 2]) >= 0,
                         "every escape has two hex digits");
                c = (unsigned char)(hex(p[i + 1]) * 16 + hex(p[i + 2]));
                FZ_CHECK(c > 0x20 && c < 0x7f && c != '/' && c != '\\',
                         "no encoded slash, NUL or control byte");
                i += 2;
            }
            if (c == '.')
                dots++;
            else
                other++;
        }
        (void)seg;
    }
    free(p);
    return 0;
}
