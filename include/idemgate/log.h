#ifndef IDEMGATE_LOG_H
#define IDEMGATE_LOG_H

/* Structured logs: one JSON object per line on stderr, written with a single write(2) so lines
 * from different threads never interleave. Callers pass only identifiers and classes: never a
 * body, a prompt, a token, a provider secret or a raw idempotency key. */

enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

/* One field: a string (s) or, when is_int is set, an integer (i). */
struct log_kv {
    const char *k;
    const char *s;
    long long i;
    int is_int;
};

#define LS(key, val) {(key), (val), 0, 0}
#define LI(key, val) {(key), NULL, (long long)(val), 1}

/* Sets the lowest level that is written; parses "debug", "info", "warn" or "error" and returns
 * 0, or -1 for an unknown name. */
int log_set_level_name(const char *name);
void log_set_level(enum log_level level);
int log_enabled(enum log_level level);

/* Writes {"ts":…,"level":…,"event":event, fields…}. fields ends with an entry whose k is NULL;
 * a field whose string is NULL is left out. */
void log_emit(enum log_level level, const char *event, const struct log_kv *fields);

/* LOG(level, event, LS(...), LI(...), ...): at least one field, so the macro stays C11. */
#define LOG(level, event, ...)                                                                     \
    do {                                                                                           \
        if (log_enabled(level))                                                                    \
            log_emit((level), (event), (const struct log_kv[]){__VA_ARGS__, {NULL, NULL, 0, 0}});  \
    } while (0)

#endif
