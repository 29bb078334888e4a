/*
 * idemgate-mock: the text fields of a multipart/form-data body (form.h).
 */
#include "form.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Copies the boundary parameter of content_type into out; false when there is none. */
static bool boundary_of(const char *content_type, char *out, size_t cap)
{
    const char *p = strcasestr(content_type, "boundary=");
    size_t n = 0;

    if (p == NULL)
        return false;
    p += strlen("boundary=");
    if (*p == '"') {
        const char *q = strchr(++p, '"');
        if (q == NULL)
            return false;
        n = (size_t)(q - p);
    } else {
        n = strcspn(p, "; \t");
    }
    if (n == 0 || n + 1 > cap)
        return false;
    memcpy(out, p, n);
    out[n] = '\0';
    return true;
}

/* The value of parameter name="..." in a Content-Disposition line [s, e), copied; NULL if absent. */
static char *param(const char *s, const char *e, const char *name)
{
    size_t nl = strlen(name);

    for (const char *p = s; p + nl + 1 < e; p++) {
        if ((p == s || p[-1] == ';' || p[-1] == ' ') && strncasecmp(p, name, nl) == 0 &&
            p[nl] == '=') {
            const char *v = p + nl + 1, *ve;
            if (*v == '"') {
                v++;
                ve = memchr(v, '"', (size_t)(e - v));
            } else {
                ve = v;
                while (ve < e && *ve != ';')
                    ve++;
            }
            if (ve == NULL)
                return NULL;
            return strndup(v, (size_t)(ve - v));
        }
    }
    return NULL;
}

static void add_field(cJSON *obj, const char *name, const char *v, size_t n)
{
    char *text = strndup(v, n);
    bool digits = n > 0 && n < 10;

    if (text == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        digits = digits && v[i] >= '0' && v[i] <= '9';
    if (strcmp(name, "_mock") == 0) {
        cJSON *c = cJSON_Parse(text);
        if (c != NULL)
            cJSON_AddItemToObject(obj, name, c);
    } else if (cJSON_GetObjectItemCaseSensitive(obj, name) == NULL) {
        if (digits)
            cJSON_AddNumberToObject(obj, name, atof(text));
        else
            cJSON_AddStringToObject(obj, name, text);
    }
    free(text);
}

cJSON *form_fields(const char *content_type, const char *body, size_t len)
{
    char boundary[128], delim[132];
    const char *end = body + len, *p;
    cJSON *obj;
    int files = 0;

    if (content_type == NULL || !boundary_of(content_type, boundary, sizeof(boundary)))
        return NULL;
    snprintf(delim, sizeof(delim), "--%s", boundary);
    if (len < strlen(delim) || memcmp(body, delim, strlen(delim)) != 0)
        return NULL;
    obj = cJSON_CreateObject();
    if (obj == NULL)
        return NULL;
    p = body + strlen(delim);
    for (;;) {
        const char *hdr_end, *data, *next, *cd, *cd_end;
        char *name, *filename;

        if (end - p >= 2 && p[0] == '-' && p[1] == '-')
            break; /* the closing delimiter */
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n')
            goto bad;
        p += 2;
        hdr_end = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
        if (hdr_end == NULL)
            goto bad;
        data = hdr_end + 4;
        next = memmem(data, (size_t)(end - data), "\r\n", 2);
        while (next != NULL && !((size_t)(end - next) >= 2 + strlen(delim) &&
                                 memcmp(next + 2, delim, strlen(delim)) == 0))
            next = memmem(next + 1, (size_t)(end - next - 1), "\r\n", 2);
        if (next == NULL)
            goto bad;
        cd = strcasestr(p, "Content-Disposition:");
        if (cd == NULL || cd > hdr_end)
            goto bad;
        cd_end = memmem(cd, (size_t)(hdr_end + 2 - cd), "\r\n", 2);
        name = param(cd, cd_end ? cd_end : hdr_end, "name");
        filename = param(cd, cd_end ? cd_end : hdr_end, "filename");
        if (name == NULL) {
            free(filename);
            goto bad;
        }
        if (filename != NULL)
            files++;
        else
            add_field(obj, name, data, (size_t)(next - data));
        free(name);
        free(filename);
        p = next + 2 + strlen(delim);
    }
    cJSON_AddNumberToObject(obj, "_files", files);
    return obj;
bad:
    cJSON_Delete(obj);
    return NULL;
}
