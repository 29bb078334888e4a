/*
 * idemgate-mock: path patterns with named captures (see route.h).
 */
#include "route.h"

#include <stdio.h>
#include <string.h>

/* Longest path or pattern considered; longer ones never match, which bounds the search. */
#define ROUTE_MAX_LEN 4096

/* The kinds of capture, named after their suffix inside the braces. */
enum capture_kind {
    CAP_SEGMENT, /* {name}: no slash, not empty */
    CAP_PLUS,    /* {name+}: anything, not empty */
    CAP_STAR,    /* {name*}: anything up to the end, possibly empty */
};

/*
 * Matches pattern (from pat) against path (from s), recording captures into m from index
 * m->count on.  Returns true on a full match.  The recursion depth is bounded by the
 * number of captures in the pattern (at most ROUTE_MAX_CAPTURES).
 */
static bool match_from(const char *pat, const char *s, struct route_match *m)
{
    const char *close, *name;
    enum capture_kind kind = CAP_SEGMENT;
    size_t name_len, avail, saved = m->count;

    while (*pat && *pat != '{') {
        if (*pat != *s)
            return false;
        pat++;
        s++;
    }
    if (*pat == '\0')
        return *s == '\0';

    /* A capture: {name}, {name+} or {name*}. */
    close = strchr(pat, '}');
    name = pat + 1;
    if (close == NULL || m->count == ROUTE_MAX_CAPTURES)
        return false;
    name_len = (size_t)(close - name);
    if (name_len > 0 && name[name_len - 1] == '+') {
        kind = CAP_PLUS;
        name_len--;
    } else if (name_len > 0 && name[name_len - 1] == '*') {
        kind = CAP_STAR;
        name_len--;
    }
    if (name_len == 0 || (kind == CAP_STAR && close[1] != '\0'))
        return false;

    avail = strlen(s);
    for (size_t len = kind == CAP_STAR ? avail : 1; len <= avail; len++) {
        /* A segment capture stops at the first slash; longer tries cannot succeed either. */
        if (kind == CAP_SEGMENT && s[len - 1] == '/')
            break;
        m->cap[saved] = (struct route_capture){name, name_len, s, len};
        m->count = saved + 1;
        if (match_from(close + 1, s + len, m))
            return true;
        m->count = saved;
    }
    return false;
}

/*
 * Returns true when path matches pattern as a whole and fills *m with the captures.
 * Returns false (and leaves *m undefined) otherwise, or when the pattern is malformed.
 */
bool route_match(const char *pattern, const char *path, struct route_match *m)
{
    m->count = 0;
    if (strlen(path) > ROUTE_MAX_LEN || strlen(pattern) > ROUTE_MAX_LEN)
        return false;
    return match_from(pattern, path, m);
}

/*
 * Copies the capture called name into out (size bytes, NUL-terminated).  Returns false when
 * there is no such capture or it does not fit.
 */
bool route_capture(const struct route_match *m, const char *name, char *out, size_t size)
{
    size_t len = strlen(name);

    for (size_t i = 0; i < m->count; i++) {
        const struct route_capture *c = &m->cap[i];

        if (c->name_len == len && memcmp(c->name, name, len) == 0) {
            if (c->value_len >= size)
                return false;
            memcpy(out, c->value, c->value_len);
            out[c->value_len] = '\0';
            return true;
        }
    }
    return false;
}

/*
 * Returns the value of the capture called name when it runs to the end of the path (a
 * {name*} capture always does), NUL-terminated there; NULL otherwise.
 */
const char *route_capture_tail(const struct route_match *m, const char *name)
{
    size_t len = strlen(name);

    for (size_t i = 0; i < m->count; i++) {
        const struct route_capture *c = &m->cap[i];

        if (c->name_len == len && memcmp(c->name, name, len) == 0)
            return c->value[c->value_len] == '\0' ? c->value : NULL;
    }
    return NULL;
}

/* One case of route_self_test(): a pattern, a path, and the capture expected (or NULL). */
struct route_case {
    const char *pattern;
    const char *path;
    bool matches;
    const char *capture; /* name of a capture to check, or NULL */
    const char *value;   /* its expected value */
};

static const struct route_case route_cases[] = {
    {"/v1/videos", "/v1/videos", true, NULL, NULL},
    {"/v1/videos", "/v1/videos/", false, NULL, NULL},
    {"/v1/videos/{id}", "/v1/videos/video_1", true, "id", "video_1"},
    {"/v1/videos/{id}", "/v1/videos/video_1/content", false, NULL, NULL},
    {"/v1/videos/{id}/content", "/v1/videos/video_1/content", true, "id", "video_1"},
    {"/v1/videos/{id}", "/v1/videos/", false, NULL, NULL},
    {"/fal/{model+}", "/fal/fal-ai/flux/dev", true, "model", "fal-ai/flux/dev"},
    {"/fal/{model+}/requests/{id}/status", "/fal/fal-ai/flux/dev/requests/req_1/status", true,
     "model", "fal-ai/flux/dev"},
    {"/fal/{model+}/requests/{id}/status", "/fal/fal-ai/flux/dev/requests/req_1/status", true, "id",
     "req_1"},
    {"/fal/{model+}/requests/{id}", "/fal/a/requests/req_1/status", false, NULL, NULL},
    {"/v1/x/{m}:predictLongRunning", "/v1/x/veo-2:predictLongRunning", true, "m", "veo-2"},
    {"/v1/x/{m}:predictLongRunning", "/v1/x/veo-2:fetchPredictOperation", false, NULL, NULL},
    {"/v1/x/{m}:predictLongRunning", "/v1/x/:predictLongRunning", false, NULL, NULL},
    {"/v1/images/by-ref/{ref*}", "/v1/images/by-ref/", true, "ref", ""},
    {"/v1/images/by-ref/{ref*}", "/v1/images/by-ref/a/b", true, "ref", "a/b"},
    {"/v1/images/by-ref/{ref*}", "/v1/images/by-re", false, NULL, NULL},
};

/* Runs the matcher's own checks; returns the number of failures and names each on stdout. */
int route_self_test(void)
{
    int failures = 0;

    for (size_t i = 0; i < sizeof(route_cases) / sizeof(route_cases[0]); i++) {
        const struct route_case *c = &route_cases[i];
        struct route_match m;
        char value[256];
        bool ok = route_match(c->pattern, c->path, &m) == c->matches;

        if (ok && c->capture)
            ok =
                route_capture(&m, c->capture, value, sizeof(value)) && strcmp(value, c->value) == 0;
        if (!ok) {
            printf("FAIL route: %s against %s\n", c->pattern, c->path);
            failures++;
        }
    }
    return failures;
}
