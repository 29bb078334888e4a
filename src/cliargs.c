#include "idemgate/cliargs.h"

#include <string.h>

/* The index of a in list, or -1. */
static int index_of(const char *const *list, const char *a)
{
    for (int i = 0; list && list[i]; i++)
        if (strcmp(list[i], a) == 0)
            return i;
    return -1;
}

int cliargs_check(int argc, char **argv, int first, const char *const *valued,
                  const char *const *flags, const char **bad, const char **why)
{
    unsigned long seen_v = 0, seen_f = 0; /* bit i: valued[i] / flags[i] was given */
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        int v = index_of(valued, a), f = v < 0 ? index_of(flags, a) : -1;
        *bad = a;
        if (v < 0 && f < 0) {
            *why = a[0] == '-' ? "unknown option" : "unexpected argument";
            return -1;
        }
        unsigned long *seen = v >= 0 ? &seen_v : &seen_f;
        unsigned long bit = 1ul << ((v >= 0 ? v : f) & 63);
        if (*seen & bit) {
            *why = "given twice";
            return -1;
        }
        *seen |= bit;
        if (v >= 0) {
            if (i + 1 >= argc) {
                *why = "wants a value";
                return -1;
            }
            i++; /* its value, whatever it looks like */
        }
    }
    *bad = NULL;
    *why = NULL;
    return 0;
}
