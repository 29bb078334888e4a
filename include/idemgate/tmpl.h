#ifndef IDEMGATE_TMPL_H
#define IDEMGATE_TMPL_H

#include <stddef.h>

/* `{placeholder}` templates for provider URLs and bodies, e.g. "/v1/jobs/{id}". A placeholder is
 * '{', a name of one or more [A-Za-z0-9_.], and '}'. "{{" and "}}" stand for a literal '{' and '}'
 * (so "{{id}}" is the text "{id}", not a placeholder), and any other '{' or '}' is a syntax
 * error. Literal text is copied unchanged; only placeholder values are escaped. */

/* Looks up a placeholder's value. name points into the template and is NOT NUL-terminated: use
 * name_len. Returns the value (NUL-terminated, only read during the call's expansion), or NULL
 * when the name is unknown. */
typedef const char *(*tmpl_lookup_fn)(const char *name, size_t name_len, void *arg);

enum tmpl_escape {
    /* Values are copied as they are. Not safe for untrusted values in URLs or JSON bodies. */
    TMPL_RAW = 0,
    /* Values are percent-encoded as one RFC 3986 path segment: A-Z a-z 0-9 - . _ ~ are kept and
     * every other byte (including '/', '?', '#', '%' and each byte of non-ASCII UTF-8) becomes
     * %XX with uppercase hex. A value that is empty, "." or ".." is refused, because such a
     * segment would still change which resource the URL names (an empty segment, or a dot
     * segment that clients and servers resolve away, even when written as %2E). */
    TMPL_URL_SEGMENT = 1,
};

/* Expands the placeholders of tmpl into a new malloc'd NUL-terminated string (*out), which the
 * caller frees. lookup is called once per placeholder occurrence, left to right. Returns 0, or -1
 * with *out set to NULL and, when errbuf is not NULL and errlen > 0, an English message written
 * to errbuf (truncated to errlen - 1 bytes and always NUL-terminated) for: a NULL tmpl, an
 * invalid esc, an unknown placeholder ("unknown placeholder 'name'"), a refused value under
 * TMPL_URL_SEGMENT (naming the placeholder), an unterminated '{', an empty name, an invalid
 * character in a name, a lone '}' (syntax errors give the 0-based byte offset), or out of memory.
 * out must not be NULL; lookup may be NULL, making every placeholder unknown. */
__attribute__((warn_unused_result)) int tmpl_expand(const char *tmpl, enum tmpl_escape esc,
                                                    tmpl_lookup_fn lookup, void *arg, char **out,
                                                    char *errbuf, size_t errlen);

/* Checks tmpl's syntax and that every placeholder is one of the names in allowed (a
 * NULL-terminated list; NULL means none is allowed), for validating configuration at start.
 * Returns 0, or -1 with the same messages as tmpl_expand in errbuf (same conventions). Values are
 * not known here, so the TMPL_URL_SEGMENT value checks are left to tmpl_expand. */
int tmpl_validate(const char *tmpl, const char *const *allowed, char *errbuf, size_t errlen);

#endif
