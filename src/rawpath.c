#include "idemgate/rawpath.h"

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Whether seg[0..n) (raw) decodes to "." or "..": each character is '.' or "%2e"/"%2E". */
static int is_dot_segment(const char *seg, size_t n)
{
    size_t dots = 0;
    for (size_t i = 0; i < n; dots++) {
        if (seg[i] == '.')
            i++;
        else if (seg[i] == '%' && i + 2 < n && seg[i + 1] == '2' &&
                 (seg[i + 2] == 'e' || seg[i + 2] == 'E'))
            i += 3;
        else
            return 0;
    }
    return dots == 1 || dots == 2;
}

enum rawpath_verdict rawpath_check(const char *path, size_t len)
{
    if (len == 0 || path[0] != '/')
        return RAWPATH_NOT_ORIGIN;
    size_t seg = 1; /* start of the current segment */
    for (size_t i = 0; i <= len; i++) {
        if (i == len || path[i] == '/') {
            if (i > 0 && is_dot_segment(path + seg, i - seg))
                return RAWPATH_DOT_SEGMENT;
            seg = i + 1;
            continue;
        }
        unsigned char c = (unsigned char)path[i];
        if (c == '%') {
            int hi = i + 2 < len ? hexval((unsigned char)path[i + 1]) : -1;
            int lo = hi >= 0 ? hexval((unsigned char)path[i + 2]) : -1;
            if (lo < 0)
                return RAWPATH_BAD_ESCAPE;
            c = (unsigned char)(hi * 16 + lo);
            if (c == 0)
                return RAWPATH_NUL;
            if (c == '/' || c == '\\')
                return RAWPATH_ENCODED_SLASH;
            if (c < 0x21 || c > 0x7e)
                return RAWPATH_CONTROL;
            i += 2;
            continue;
        }
        if (c < 0x21 || c > 0x7e || c == '\\')
            return RAWPATH_CONTROL;
    }
    return RAWPATH_OK;
}

const char *rawpath_verdict_name(enum rawpath_verdict v)
{
    switch (v) {
    case RAWPATH_OK:
        return "ok";
    case RAWPATH_NOT_ORIGIN:
        return "not_origin_form";
    case RAWPATH_BAD_ESCAPE:
        return "malformed_escape";
    case RAWPATH_NUL:
        return "nul";
    case RAWPATH_ENCODED_SLASH:
        return "encoded_slash";
    case RAWPATH_CONTROL:
        return "control_byte";
    case RAWPATH_DOT_SEGMENT:
        return "dot_segment";
    }
    return "unknown";
}
