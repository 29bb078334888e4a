#include "idemgate/headers.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int hdr_idempotency_key(const char *value, size_t len, char out[HDR_KEY_MAX + 1])
{
    size_t n = 0;
    if (!value || len == 0)
        return -1;
    const char *end = value + len;
    if (value[0] == '"') {
        const char *p = value + 1;
        for (;; p++) {
            if (p == end)
                return -1; /* unterminated */
            unsigned char c = (unsigned char)*p;
            if (c == '"')
                break;
            if (c == '\\') {
                if (++p == end)
                    return -1;
                c = (unsigned char)*p;
                if (c != '"' && c != '\\')
                    return -1;
            } else if (c < 0x20 || c > 0x7e) {
                return -1;
            }
            if (n == HDR_KEY_MAX)
                return -1;
            out[n++] = (char)c;
        }
        if (p + 1 != end) /* parameters or trailing bytes after the string */
            return -1;
    } else {
        for (const char *p = value; p < end; p++) {
            unsigned char c = (unsigned char)*p;
            if (c < 0x20 || c > 0x7e || n == HDR_KEY_MAX)
                return -1;
            out[n++] = (char)c;
        }
        if (out[0] == ' ' || out[n - 1] == ' ')
            return -1;
    }
    if (n == 0)
        return -1;
    out[n] = '\0';
    return (int)n;
}

const char *hdr_bearer(const char *value, size_t *len)
{
    if (!value || strncasecmp(value, "Bearer ", 7) != 0)
        return NULL;
    const char *t = value + 7;
    while (*t == ' ')
        t++;
    size_t n = strlen(t);
    while (n && t[n - 1] == ' ')
        n--;
    /* No length limit: a tenant's token is only ever hashed, and the HTTP server bounds the
     * header block as a whole. A long token refused here would read as a wrong one. */
    if (n == 0)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (t[i] <= 0x20 || t[i] > 0x7e)
            return NULL;
    *len = n;
    return t;
}

int hdr_prefer_wait(const char *value, int cap)
{
    if (!value)
        return 0;
    const char *p = value;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (strncasecmp(p, "wait", 4) == 0) {
            const char *q = p + 4;
            while (*q == ' ')
                q++;
            if (*q == '=') {
                q++;
                while (*q == ' ')
                    q++;
                if (*q == '"')
                    q++;
                if (isdigit((unsigned char)*q)) {
                    long v = strtol(q, NULL, 10);
                    if (v < 0)
                        v = 0;
                    return v > cap ? cap : (int)v;
                }
            }
        }
        p = strchr(p, ',');
        if (!p)
            break;
    }
    return 0;
}
