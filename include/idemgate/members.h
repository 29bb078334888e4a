#ifndef IDEMGATE_MEMBERS_H
#define IDEMGATE_MEMBERS_H

#include <cjson/cJSON.h>
#include <stddef.h>

/* The member names a JSON object of the configuration or of a provider profile may have, so that
 * a misspelt member ("timeout" for "timeouts", "default_wait" for "default_wait_seconds") is
 * refused at load time instead of being ignored in favour of a default. Each kind of object has a
 * static table next to the code that reads it (config.c, profile.c, pricing.c, archprof.c); one
 * pure function walks a parsed document against its tables and reports the first unknown (or
 * duplicated) member with its JSON path and the nearest valid name at that place. */

enum memb_kind {
    MEMB_VALUE = 0, /* any value; what is inside is not checked here (its reader checks it) */
    MEMB_OBJECT,    /* an object checked against sub */
    MEMB_ARRAY,     /* an array whose object elements are checked against sub */
    MEMB_MAP,       /* an object of free names whose object values are checked against sub */
};

struct memb_table;

struct memb {
    const char *name;
    enum memb_kind kind;
    const struct memb_table *sub; /* for MEMB_OBJECT, MEMB_ARRAY and MEMB_MAP */
};

/* The valid names at one place: the entries of m, then those of also (a shared part, such as the
 * members a provider entry and a profile file both take); NULL ends the chain. */
struct memb_table {
    const struct memb *m;
    size_t n;
    const struct memb_table *also;
};

#define MEMB_TABLE(arr, also_table) {(arr), sizeof(arr) / sizeof((arr)[0]), (also_table)}

enum memb_problem_kind { MEMB_OK = 0, MEMB_UNKNOWN, MEMB_DUPLICATE };

/* What memb_check found: the JSON path of the member (e.g. `providers[2].timeout`,
 * `pricing.variants.tables.gpt-image-1.per_outptu`, `tables['a b'].x` for a name that is not
 * [A-Za-z0-9_-]+; truncated to fit) and, for an unknown one, the nearest valid name at that place
 * (static storage, from the table) or NULL when none is close. */
struct memb_problem {
    enum memb_problem_kind kind;
    char path[256];
    const char *suggest;
};

/* The optimal-string-alignment edit distance between a and b (insertions, deletions,
 * substitutions and transpositions of two neighbours each count 1). Names longer than 64 bytes
 * are compared by their first 64 bytes plus the difference in length. */
size_t memb_distance(const char *a, const char *b);

/* The valid name of t (and its also chain) nearest to name, or NULL when none is close. Close
 * means: equal but for ASCII case; or an edit distance of at most max(strlen(name), 3) / 3; or
 * one name is a prefix of the other and the shorter has at least 3 bytes (`default_wait` for
 * `default_wait_seconds`). Of the close names the one at the smallest distance wins, the first in
 * table order on a tie. */
const char *memb_nearest(const char *name, const struct memb_table *t);

/* Checks o against t (and each nested object against its own table), path prefix `prefix` ("" at
 * a document's root). Returns 0 when every member is known and none is repeated; otherwise -1
 * with the first problem in document order in *p. A value of another JSON type than its table
 * expects (a string where an object belongs) is left to the member's reader. Pure: reads o and
 * t, writes *p only. */
__attribute__((warn_unused_result)) int memb_check(const cJSON *o, const struct memb_table *t,
                                                   const char *prefix, struct memb_problem *p);

/* The English text of a problem, e.g. `unknown member providers[2].timeout (did you mean
 * "timeouts"?)` or `duplicate member retry`, into buf. */
void memb_message(const struct memb_problem *p, char *buf, size_t len);

#endif
