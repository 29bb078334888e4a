#include "idemgate/log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int min_level = LOG_INFO;
static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_set_level(enum log_level level)
{
    atomic_store(&min_level, (int)level);
}

int log_set_level_name(const char *name)
{
    for (int i = 0; i < 4; i++) {
        if (strcmp(name, level_names[i]) == 0) {
            log_set_level((enum log_level)i);
            return 0;
        }
    }
    return -1;
}

int log_enabled(enum log_level level)
{
    return (int)level >= atomic_load(&min_level);
}

/* Appends s as the inside of a JSON string, escaping quotes, backslashes and every control
 * character, so that a hostile value can never split a log line. Truncates at the buffer end. */
static size_t put_escaped(char *buf, size_t pos, size_t cap, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p && pos + 7 < cap; p++) {
        if (*p == '"' || *p == '\\') {
            buf[pos++] = '\\';
            buf[pos++] = (char)*p;
        } else if (*p < 0x20 || *p == 0x7f) {
            pos += (size_t)snprintf(buf + pos, cap - pos, "\\u%04x", *p);
        } else {
            buf[pos++] = (char)*p;
        }
    }
    return pos;
}

static size_t put_raw(char *buf, size_t pos, size_t cap, const char *s)
{
    size_t n = strlen(s);
    if (pos + n >= cap)
        n = cap - pos - 1;
    memcpy(buf + pos, s, n);
    return pos + n;
}

void log_emit(enum log_level level, const char *event, const struct log_kv *fields)
{
    char buf[2048];
    size_t cap = sizeof(buf) - 2; /* room for "}\n" */
    struct timespec ts;
    struct tm tm;
    char tbuf[64];

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(tbuf, sizeof(tbuf), "%Y-%m-%dT%H:%M:%S", &tm);
    size_t pos = (size_t)snprintf(buf, cap, "{\"ts\":\"%s.%03ldZ\",\"level\":\"%s\",\"event\":\"",
                                  tbuf, ts.tv_nsec / 1000000, level_names[level]);
    pos = put_escaped(buf, pos, cap, event);
    pos = put_raw(buf, pos, cap, "\"");
    for (const struct log_kv *f = fields; f && f->k; f++) {
        if (!f->is_int && !f->s)
            continue;
        pos = put_raw(buf, pos, cap, ",\"");
        pos = put_escaped(buf, pos, cap, f->k);
        pos = put_raw(buf, pos, cap, "\":");
        if (f->is_int) {
            char num[32];
            snprintf(num, sizeof(num), "%lld", f->i);
            pos = put_raw(buf, pos, cap, num);
        } else {
            pos = put_raw(buf, pos, cap, "\"");
            pos = put_escaped(buf, pos, cap, f->s);
            pos = put_raw(buf, pos, cap, "\"");
        }
    }
    buf[pos++] = '}';
    buf[pos++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, pos);
    (void)w;
}
