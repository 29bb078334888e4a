#ifndef IDEMGATE_FUZZ_H
#define IDEMGATE_FUZZ_H

/* What every libFuzzer harness shares: the entry points' prototypes, a check that turns a broken
 * property into a crash libFuzzer records, and the splitting of one input into NUL-terminated
 * pieces. Each piece is a malloc'd copy of exactly its bytes plus the NUL, so AddressSanitizer
 * reports any read past it (a parser that runs off the end of a header value, say). */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A property that must hold for every input: when it does not, say which and abort (libFuzzer
 * saves the input as a crash). */
#define FZ_CHECK(cond, what)                                                                      \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "fuzz property broken: %s (%s:%d: %s)\n", what, __FILE__, __LINE__,  \
                    #cond);                                                                       \
            abort();                                                                              \
        }                                                                                         \
    } while (0)

#define FZ_MAX_PARTS 8

struct fz_parts {
    char *part[FZ_MAX_PARTS]; /* NUL-terminated copies; part[i] may hold NUL bytes before len */
    size_t len[FZ_MAX_PARTS];
    int n;
};

/* A new NUL-terminated copy of d[0..n); aborts when memory runs out (a harness, not a server). */
static inline char *fz_strndup(const uint8_t *d, size_t n)
{
    char *s = malloc(n + 1);
    if (!s)
        abort();
    if (n)
        memcpy(s, d, n);
    s[n] = '\0';
    return s;
}

/* Splits d[0..size) on '\n' into exactly `want` parts (1..FZ_MAX_PARTS): the first want - 1
 * lines, and the rest (newlines included) as the last part. Missing parts are empty strings. */
static inline void fz_split(const uint8_t *d, size_t size, int want, struct fz_parts *p)
{
    size_t at = 0;
    p->n = want;
    for (int i = 0; i < want; i++) {
        size_t end = size;
        if (i + 1 < want) {
            const uint8_t *nl = at < size ? memchr(d + at, '\n', size - at) : NULL;
            end = nl ? (size_t)(nl - d) : size;
        }
        p->part[i] = fz_strndup(d + at, end - at);
        p->len[i] = end - at;
        at = end < size ? end + 1 : size;
    }
}

static inline void fz_parts_free(struct fz_parts *p)
{
    for (int i = 0; i < p->n; i++)
        free(p->part[i]);
    p->n = 0;
}

#endif
