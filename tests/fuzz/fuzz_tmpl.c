/* libFuzzer harness: `{placeholder}` templates (src/tmpl.c) for provider URLs and bodies, with
 * values that come from outside (task ids a provider hands back, client references).
 *
 * Input: the first line is the template; each further line is a value, bound in turn to the
 * names id, client_ref, since, until, cursor (a value may hold any byte but '\n'). Checks:
 * - tmpl_validate over the bound names accepts exactly what tmpl_expand (raw) accepts;
 * - a value escaped as a path segment never adds a '/', '?' or '#' to the URL: the output has as
 *   many as the template's literal text (so a provider's id cannot change which resource, or
 *   which query, the gateway calls);
 * - an error message is always NUL-terminated inside its buffer, even a tiny one. */
#include "fuzz.h"

#include "idemgate/tmpl.h"

#define NAMES 5
static const char *const names[NAMES + 1] = {"id", "client_ref", "since", "until", "cursor",
                                             NULL};

struct vals {
    const char *v[NAMES];
};

static const char *lookup(const char *name, size_t len, void *arg)
{
    struct vals *x = arg;
    for (int i = 0; i < NAMES; i++)
        if (strlen(names[i]) == len && memcmp(names[i], name, len) == 0)
            return x->v[i];
    return NULL;
}

/* Counts c in the template's literal text: "{{" and "}}" are one brace, placeholders are skipped.
 * Only called on a template tmpl_expand accepted. */
static size_t literal_count(const char *t, char c)
{
    size_t n = 0;
    for (const char *p = t; *p; p++) {
        if ((p[0] == '{' && p[1] == '{') || (p[0] == '}' && p[1] == '}')) {
            p++;
            continue;
        }
        if (*p == '{') {
            p = strchr(p, '}');
            continue;
        }
        n += *p == c;
    }
    return n;
}

static size_t count(const char *s, char c)
{
    size_t n = 0;
    for (; *s; s++)
        n += *s == c;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_parts in;
    fz_split(data, size, NAMES + 1, &in);
    struct vals x = {{0}};
    for (int i = 0; i < NAMES; i++)
        x.v[i] = in.part[i + 1];
    const char *t = in.part[0];
    char err[96], tiny[4];
    char *raw = NULL, *seg = NULL;

    int v = tmpl_validate(t, names, err, sizeof(err));
    FZ_CHECK(v == 0 || memchr(err, '\0', sizeof(err)) != NULL, "message NUL-terminated");
    int r = tmpl_expand(t, TMPL_RAW, lookup, &x, &raw, tiny, sizeof(tiny));
    FZ_CHECK(r == 0 || memchr(tiny, '\0', sizeof(tiny)) != NULL, "tiny message NUL-terminated");
    FZ_CHECK((v == 0) == (r == 0), "validate accepts what expand accepts");
    FZ_CHECK((r == 0) == (raw != NULL), "output iff success");
    int s = tmpl_expand(t, TMPL_URL_SEGMENT, lookup, &x, &seg, err, sizeof(err));
    FZ_CHECK((s == 0) == (seg != NULL), "output iff success");
    if (s == 0) {
        FZ_CHECK(r == 0, "escaping only refuses more");
        static const char special[] = {'/', '?', '#', ' ', '\r', '\n'};
        for (size_t i = 0; i < sizeof(special); i++)
            FZ_CHECK(count(seg, special[i]) == literal_count(t, special[i]),
                     "a value never adds a separator to the URL");
    }
    free(raw);
    free(seg);
    fz_parts_free(&in);
    return 0;
}
