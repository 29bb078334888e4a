#ifndef IDEMGATE_CLIARGS_H
#define IDEMGATE_CLIARGS_H

/* The command line's options, checked before anything is done: `idemgate tenant budget acme
 * --daily 10` (for --day) must not run as if no option were given — that clears the day's
 * budget. Pure. */

/* Checks argv[first..argc) as options only: each one of `valued` followed by its value, or one
 * of `flags` alone (both NULL-terminated lists, either may be NULL), each at most once. Returns 0,
 * or -1 with *bad the first argument that is not such an option (unknown, given twice, or a
 * valued option with nothing after it) and *why a short reason. */
int cliargs_check(int argc, char **argv, int first, const char *const *valued,
                  const char *const *flags, const char **bad, const char **why);

#endif
