/* libFuzzer harness: the multipart/form-data reader (src/multipart.c) that every upload passes
 * before anything is recorded. The input's first line is the Content-Type's boundary parameter,
 * the rest the body, each in a buffer of exactly its length plus a NUL.
 *
 * Properties checked:
 * - a boundary mp_boundary accepts is 1..70 bytes;
 * - every part read lies inside the body, in order, without overlapping;
 * - the Content-Type a recorded body is sent with names the very boundary it was read with;
 * - the text fields are one JSON object cJSON reads whole;
 * - the canonical form is the same for the parts written again under another boundary: what is
 *   fingerprinted is what the parts are, never how they were delimited. */
#include "fuzz.h"

#include "idemgate/multipart.h"

#include <cjson/cJSON.h>

#define OTHER "zQ7-fuzz-boundary-0123456789-abcdefghijklmnopqrstuvwxyz-XYZ"

static size_t put(char *o, const char *s, size_t n)
{
    memcpy(o, s, n);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    size_t hl = nl ? (size_t)(nl - data) : size;
    size_t bl = nl ? size - hl - 1 : 0;
    char *param = fz_strndup(data, hl);
    char *body = fz_strndup(nl ? nl + 1 : data + size, bl);
    char ctype[256], boundary[MP_BOUNDARY_MAX + 1];
    snprintf(ctype, sizeof(ctype), "multipart/form-data; boundary=%s", param);
    int b = mp_boundary(ctype, boundary);
    FZ_CHECK(b == -1 || (b >= 1 && b <= MP_BOUNDARY_MAX && strlen(boundary) == (size_t)b),
             "a boundary is 1 to 70 bytes");
    struct mp_part parts[16];
    size_t n = 0;
    char why[128];
    if (b > 0 && mp_parse(body, bl, boundary, parts, 16, &n, why, sizeof(why)) == 0) {
        FZ_CHECK(n >= 1 && n <= 16, "at least one part, no more than room");
        const char *prev = body;
        size_t total = 0;
        for (size_t i = 0; i < n; i++) {
            FZ_CHECK(parts[i].data >= prev && parts[i].data + parts[i].data_len <= body + bl,
                     "each part inside the body, in order");
            prev = parts[i].data + parts[i].data_len;
            total += parts[i].data_len + parts[i].name_len;
        }
        FZ_CHECK(total <= bl, "parts do not overlap");
        char sent[MP_CTYPE_MAX], again[MP_BOUNDARY_MAX + 1];
        FZ_CHECK(mp_content_type_of(body, bl, sent, sizeof(sent)) == 1, "sent as multipart");
        FZ_CHECK(mp_boundary(sent, again) == b && strcmp(again, boundary) == 0,
                 "sent with its own boundary");
        size_t fl = 0, cl = 0, cl2 = 0;
        char *fields = mp_fields_json(parts, n, &fl);
        char *canon = mp_canonical(parts, n, &cl);
        FZ_CHECK(fields && canon, "no allocation fails here");
        cJSON *doc = cJSON_ParseWithLength(fields, fl);
        FZ_CHECK(cJSON_IsObject(doc), "the text fields are a JSON object");
        cJSON_Delete(doc);
        /* The same parts under another boundary (when no content holds it). */
        size_t cap = bl * 2 + 64 * (n + 1) + sizeof(OTHER) * (n + 1);
        char *re = malloc(cap), *o = re;
        int clash = memmem(body, bl, OTHER, sizeof(OTHER) - 1) != NULL;
        for (size_t i = 0; re && i < n && !clash; i++) {
            const struct mp_part *p = &parts[i];
            static const char head[] = "--" OTHER "\r\nContent-Disposition: form-data; name=\"";
            o += put(o, head, sizeof(head) - 1);
            o += put(o, p->name, p->name_len);
            o += put(o, "\"", 1);
            if (p->filename) {
                o += put(o, "; filename=\"", 12);
                o += put(o, p->filename, p->filename_len);
                o += put(o, "\"", 1);
            }
            o += put(o, "\r\n", 2);
            if (p->ctype) {
                o += put(o, "Content-Type: ", 14);
                o += put(o, p->ctype, p->ctype_len);
                o += put(o, "\r\n", 2);
            }
            o += put(o, "\r\n", 2);
            o += put(o, p->data, p->data_len);
            o += put(o, "\r\n", 2);
        }
        if (re && !clash) {
            static const char tail[] = "--" OTHER "--";
            o += put(o, tail, sizeof(tail) - 1);
            struct mp_part parts2[16];
            size_t n2 = 0;
            /* A name or filename read as a token may hold what a quoted string cannot (a
             * quote): written again quoted, it may not read back, which is no property. */
            if (mp_parse(re, (size_t)(o - re), OTHER, parts2, 16, &n2, why, sizeof(why)) == 0) {
                char *canon2 = mp_canonical(parts2, n2, &cl2);
                FZ_CHECK(canon2 && n2 == n && cl2 == cl && memcmp(canon, canon2, cl) == 0,
                         "the canonical form does not depend on the boundary");
                free(canon2);
            }
        }
        free(re);
        free(fields);
        free(canon);
    }
    free(param);
    free(body);
    return 0;
}
