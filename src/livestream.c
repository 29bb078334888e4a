/* The live copy of a create's event stream for the clients waiting on this replica
 * (livestream.h). */
#include "idemgate/livestream.h"

#include "idemgate/http_server.h"
#include "idemgate/log.h"
#include "idemgate/sse.h"
#include "idemgate/upstream.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct parked {
    struct hs_req *r;
    size_t pos;
    double deadline; /* CLOCK_MONOTONIC seconds after which it is woken anyway; 0: none */
    struct parked *next;
};

struct ls {
    char job_id[64];
    atomic_int refs;
    pthread_mutex_t mu;
    /* The bytes: all in buf (fd < 0), or, once longer than the memory share (ls_configure), all
     * in an unlinked file fd, buf keeping only [base, len) — the event being scanned. fed: bytes
     * offered by the transfer (len < fed: some were not kept). */
    char *buf;
    size_t len, cap, max, base, fed;
    int fd;
    int spill_failed; /* the spool took no more of it once: it stays in memory from then on */
    int began, ended, cut, closed, attempt_over;
    /* The terminal event is held back until the result is recorded (ls_settle): `held` is
     * where it begins (HELD_NONE: none seen yet), `scan` where the next unexamined event
     * begins; `settled` says the record is written (the rest is released) or failed (the
     * readers end cut at held: what they got was never the recorded answer). */
    size_t held, scan;
    /* How far into the event at `scan` the search for its end got (ev_at bytes, at a line's
     * start or not): each feed goes on from there, never from the event's start again (a
     * single event of megabytes, fed in 16 KiB pieces, would be read over and over). */
    size_t ev_at;
    int ev_mid_line;
    int settled, recorded;
    /* Until an event carrying output arrives (sse.h: a delta, a content block, an output item),
     * nothing is shown (fmt: the stream's format, SSE_NONE: shown from its first event): a
     * refusal the provider streams first (an error event: a 429, an overload) is what the job
     * backs off from and sends again — shown only when it is the job's record (settled and
     * recorded), otherwise its readers find the stream never began and wait for the job.
     * refused: an error event came before any output (what follows it is never output). */
    int fmt, output, refused;
    struct parked *parked;
    struct ls *next; /* in its registry bucket */
    int registered;
    int attached; /* an attempt feeds it (ls_attach); under reg_mu */
};

/* Where a long stream's bytes go (ls_configure): its memory share and the spool folder. */
static size_t mem_share;
static char spool_dir[1024] = "/var/tmp";
static atomic_int spool_warned;
static atomic_long spooled_now; /* streams whose bytes are in a spool file now */
static atomic_int stopping;     /* ls_wake_all ran: nobody parks from then on */

void ls_configure(size_t memory_bytes, const char *dir)
{
    mem_share = memory_bytes;
    if (dir && *dir)
        snprintf(spool_dir, sizeof(spool_dir), "%s", dir);
}

#define BUCKETS 256
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ls *reg[BUCKETS];
static size_t reg_count;

static unsigned bucket(const char *id)
{
    unsigned h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h % BUCKETS;
}

#define HELD_NONE ((size_t)-1)

/* Whether the stream is hidden from its readers: no output yet, and not the job's record. */
static int hidden_locked(const struct ls *s)
{
    return s->fmt != SSE_NONE && !s->output && !(s->settled && s->recorded);
}

/* How far readers may read: whole events only (never the first bytes of an event that may be
 * the terminal one), up to the held terminal event until the record is written; all of it once
 * recorded, or once the transfer ended without a terminal event (a cut: its tail too). */
static size_t visible_locked(const struct ls *s)
{
    if (hidden_locked(s))
        return 0;
    if (s->held != HELD_NONE)
        return s->recorded ? s->len : s->held;
    return s->ended || s->closed ? s->len : s->scan;
}

/* Whether the stream's end can be told: it ended and nothing is held, or the record's fate is
 * known, or the stream was closed. */
static int end_known_locked(const struct ls *s)
{
    if (hidden_locked(s)) /* its fate is known once the record is written (or not), or closed */
        return s->settled || s->closed;
    return (s->ended && (s->held == HELD_NONE || s->settled)) || s->closed;
}

/* Whether a reader at pos has something (the caller holds s->mu). */
static int ready_locked(const struct ls *s, size_t pos)
{
    return visible_locked(s) > pos || end_known_locked(s) || (s->attempt_over && !s->began);
}

/* Whether a type names a terminal event: Anthropic's `message_stop`, the Responses API's
 * `response.completed`, `.incomplete` or `.failed`. */
static int terminal_type(const char *t, size_t n)
{
    static const char *const types[] = {"message_stop", "response.completed",
                                        "response.incomplete", "response.failed"};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (n == strlen(types[i]) && memcmp(t, types[i], n) == 0)
            return 1;
    return 0;
}

/* Whether JSON data names a terminal type in its top-level "type" (an event without an `event:`
 * line, as sse.c reads it). Parsed only when the text holds one of the names. */
static int terminal_data_type(const char *d, size_t n)
{
    if (!memmem(d, n, "message_stop", 12) && !memmem(d, n, "response.", 9))
        return 0;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(d, n, &end, 0);
    const cJSON *t = j && end == d + n ? cJSON_GetObjectItemCaseSensitive(j, "type") : NULL;
    int yes = cJSON_IsString(t) && terminal_type(t->valuestring, strlen(t->valuestring));
    cJSON_Delete(j);
    return yes;
}

/* Whether the whole event ev[0..n) is a terminal event, read as sse.c reads events (WHATWG):
 * lines end in CRLF, LF or CR; a field's value follows its colon and one optional space; the
 * type is the `event` field's, else the data's "type"; OpenAI Chat's end is the data `[DONE]`,
 * under an `event:` line too.
 * Only whole fields count: a delta's text is inside a JSON string, never a field of its own. */
static int terminal_event(const char *ev, size_t n)
{
    const char *type = NULL, *data = NULL;
    size_t type_n = 0, data_n = 0;
    int data_lines = 0;
    char *joined = NULL; /* several data lines, joined by newlines as sse.c joins them */
    for (int pass = 0; pass < 2; pass++) {
        size_t jn = 0;
        int have = 0; /* a data line was joined already (an empty one too) */
        for (size_t at = 0; at < n;) {
            size_t e = at;
            while (e < n && ev[e] != '\r' && ev[e] != '\n')
                e++;
            const char *line = ev + at;
            size_t len = e - at, c = 0;
            while (c < len && line[c] != ':')
                c++;
            size_t vs = c < len ? c + 1 : len;
            if (vs < len && line[vs] == ' ')
                vs++;
            if (pass == 0 && c == 5 && memcmp(line, "event", 5) == 0) {
                type = line + vs, type_n = len - vs;
            } else if (c == 4 && memcmp(line, "data", 4) == 0) {
                if (pass == 0 && data_lines++ == 0)
                    data = line + vs, data_n = len - vs;
                if (pass == 1) {
                    if (have++)
                        joined[jn++] = '\n';
                    memcpy(joined + jn, line + vs, len - vs);
                    jn += len - vs;
                }
            }
            at = e + (e + 1 < n && ev[e] == '\r' && ev[e + 1] == '\n' ? 2 : 1);
        }
        if (pass == 1) {
            data = joined, data_n = jn;
            break;
        }
        if (type_n || data_lines < 2 || !(joined = malloc(n + 1)))
            break; /* out of memory: the first line alone is read */
    }
    /* OpenAI Chat's end is the data [DONE] whatever the event's type, as sse.c reads it. */
    int done = data_lines == 1 && data_n == 6 && memcmp(data, "[DONE]", 6) == 0;
    int yes = done                ? 1
              : type_n            ? terminal_type(type, type_n)
                                  : data_lines > 0 && terminal_data_type(data, data_n);
    free(joined);
    return yes;
}

/* Where the event that begins at b ends (just past the blank line that ends it), or 0 when it
 * is not whole yet. A line ends in CRLF, LF or CR; a blank line is a line end at a line's start.
 * A CR last in b, at a line's start, ends the event (an LF after it is then a blank line of its
 * own: an empty event, never dispatched). The search starts at *at (mid-line or not, as the
 * last call left it) and leaves there what the next call needs. */
static size_t event_end(const char *b, size_t n, size_t *at, int *mid_line)
{
    size_t i = *at;
    int line_start = !*mid_line;
    for (; i < n; i++) {
        if (b[i] != '\r' && b[i] != '\n') {
            line_start = 0;
            continue;
        }
        if (b[i] == '\r' && i + 1 == n && !line_start)
            break; /* the line's end may be a CRLF whose LF is still to come: read it again */
        size_t t = b[i] == '\r' && i + 1 < n && b[i + 1] == '\n' ? 2 : 1;
        if (line_start) {
            *at = 0, *mid_line = 0; /* for the next event */
            return i + t;
        }
        line_start = 1;
        i += t - 1;
    }
    *at = i, *mid_line = !line_start;
    return 0;
}

/* Examines the events completed since the last call for a terminal one (the caller holds
 * s->mu): its start becomes `held`. */
static void scan_locked(struct ls *s)
{
    while (s->held == HELD_NONE && s->scan < s->len) {
        const char *b = s->buf + (s->scan - s->base);
        size_t end = event_end(b, s->len - s->scan, &s->ev_at, &s->ev_mid_line);
        if (!end)
            return; /* the event is not whole yet */
        if (s->fmt != SSE_NONE && !s->output && !s->refused) {
            struct sse_verdict v;
            if (sse_read((enum sse_format)s->fmt, b, end, &v) < 0)
                s->output = 1; /* out of memory: shown as it comes, as before */
            else if (v.error && !v.output)
                s->refused = 1;
            else if (v.output)
                s->output = 1;
            sse_verdict_fini(&v); /* (holds no usage after a failed read) */
        }
        if (terminal_event(b, end))
            s->held = s->scan;
        else
            s->scan += end;
    }
}

/* Resumes every parked reader that has something now (the caller holds s->mu). */
static void wake_locked(struct ls *s)
{
    struct parked **pp = &s->parked;
    while (*pp) {
        struct parked *p = *pp;
        if (ready_locked(s, p->pos)) {
            *pp = p->next;
            hs_resume(p->r);
            free(p);
        } else {
            pp = &p->next;
        }
    }
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Wakes the parked readers whose deadline passed, in every registered stream, every 100 ms:
 * a client waiting for a stream to begin is answered when its wait is over, however long the
 * provider (or the queue before the call) takes. Every second it also wakes the readers whose
 * client is gone (marked: their handler ends them), so that a client that left while the
 * provider paused — a reasoning model may think for minutes before its first token — does not
 * hold its connection and its tenant's wait slot until the next event. One thread, started with
 * the first stream. */
#define GONE_CHECK_TICKS 10
static void *sweep(void *arg)
{
    (void)arg;
    struct ls **v = NULL;
    size_t cap = 0;
    for (unsigned tick_n = 1;; tick_n++) {
        struct timespec tick = {0, 100 * 1000 * 1000};
        nanosleep(&tick, NULL);
        int check_gone = tick_n % GONE_CHECK_TICKS == 0;
        /* The streams are taken (a reference each) under reg_mu, and looked at after it is
         * released: a check of thousands of connections never holds up ls_open and ls_close. */
        size_t n = 0;
        pthread_mutex_lock(&reg_mu);
        if (reg_count > cap) {
            size_t want = reg_count * 2;
            struct ls **nv = realloc(v, want * sizeof(*nv));
            if (nv)
                v = nv, cap = want;
        }
        for (size_t b = 0; b < BUCKETS; b++)
            for (struct ls *s = reg[b]; s && n < cap; s = s->next) {
                atomic_fetch_add(&s->refs, 1);
                v[n++] = s;
            }
        pthread_mutex_unlock(&reg_mu);
        double now = mono_now();
        for (size_t i = 0; i < n; i++) {
            struct ls *s = v[i];
            pthread_mutex_lock(&s->mu);
            struct parked **pp = &s->parked;
            while (*pp) {
                struct parked *p = *pp;
                int gone = check_gone && hs_req_peer_closed(p->r);
                if (gone)
                    hs_req_set_gone(p->r);
                /* A stream that began is the answer the client waits for, shown from its first
                 * output (a reasoning model may think for minutes): its wait deadline no longer
                 * applies, as when its first bytes were shown at once. */
                int begun = s->began && hidden_locked(s);
                if (gone || (!begun && p->deadline > 0 && now >= p->deadline)) {
                    *pp = p->next;
                    hs_resume(p->r);
                    free(p);
                } else {
                    pp = &p->next;
                }
            }
            pthread_mutex_unlock(&s->mu);
            ls_release(s);
        }
    }
    return NULL;
}

static pthread_once_t sweeper_once = PTHREAD_ONCE_INIT;

static void start_sweeper(void)
{
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &a, sweep, NULL) != 0) /* deadlines then end with the call */
        fprintf(stderr, "idemgate: the live streams' deadline thread did not start\n");
    pthread_attr_destroy(&a);
}

struct ls *ls_open(const char *job_id, size_t max_bytes, int format)
{
    pthread_once(&sweeper_once, start_sweeper);
    unsigned b = bucket(job_id);
    pthread_mutex_lock(&reg_mu);
    for (struct ls *s = reg[b]; s; s = s->next)
        if (strcmp(s->job_id, job_id) == 0) {
            atomic_fetch_add(&s->refs, 1);
            pthread_mutex_unlock(&reg_mu);
            return s;
        }
    struct ls *s = calloc(1, sizeof(*s));
    if (!s) {
        pthread_mutex_unlock(&reg_mu);
        return NULL;
    }
    snprintf(s->job_id, sizeof(s->job_id), "%s", job_id);
    atomic_init(&s->refs, 2); /* the registry's and the caller's */
    pthread_mutex_init(&s->mu, NULL);
    s->max = max_bytes;
    s->fmt = format;
    s->fd = -1;
    s->held = HELD_NONE;
    s->next = reg[b];
    s->registered = 1;
    reg[b] = s;
    reg_count++;
    pthread_mutex_unlock(&reg_mu);
    return s;
}

/* The registered stream of job_id, referenced, and marked fed when attach. A stream one attempt
 * attached to is never attached again: a resend claimed before that attempt closed it (the result
 * committed, the row due at once) would feed an ended stream — dropped — and read the earlier
 * attempt's bytes back as its own record. The resend keeps its own body. */
static struct ls *find(const char *job_id, int attach)
{
    unsigned b = bucket(job_id);
    pthread_mutex_lock(&reg_mu);
    struct ls *s = reg[b];
    while (s && strcmp(s->job_id, job_id) != 0)
        s = s->next;
    if (s && attach && s->attached)
        s = NULL;
    if (s) {
        atomic_fetch_add(&s->refs, 1);
        s->attached |= attach;
    }
    pthread_mutex_unlock(&reg_mu);
    return s;
}

struct ls *ls_find(const char *job_id)
{
    return find(job_id, 0);
}

struct ls *ls_attach(const char *job_id)
{
    return find(job_id, 1);
}

/* Unregisters job_id's stream and ends it; unless_attached: not one an attempt feeds; only: that
 * stream alone (not another registered under the same job since). */
static void close_stream(const char *job_id, int unless_attached, const struct ls *only)
{
    unsigned b = bucket(job_id);
    pthread_mutex_lock(&reg_mu);
    struct ls **pp = &reg[b];
    while (*pp && strcmp((*pp)->job_id, job_id) != 0)
        pp = &(*pp)->next;
    struct ls *s = *pp;
    if (s && only && s != only)
        s = NULL; /* another attempt's: it ends it */
    else if (s && unless_attached && s->attached)
        s = NULL; /* its attempt ends it (ls_close_own) */
    else if (s) {
        *pp = s->next;
        s->registered = 0;
        reg_count--;
    }
    pthread_mutex_unlock(&reg_mu);
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    if (s->began && !s->ended) /* fed no more: whatever was not ended is cut */
        s->ended = s->cut = 1;
    wake_locked(s);
    pthread_mutex_unlock(&s->mu);
    ls_release(s); /* the registry's reference */
}

void ls_close_own(struct ls *s)
{
    if (s)
        close_stream(s->job_id, 0, s);
}

void ls_close_unfed(const char *job_id)
{
    close_stream(job_id, 1, NULL);
}

void ls_release(struct ls *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    while (s->parked) { /* nobody can be parked on a stream nobody references; defensive */
        struct parked *p = s->parked;
        s->parked = p->next;
        free(p);
    }
    pthread_mutex_destroy(&s->mu);
    if (s->fd >= 0) {
        close(s->fd);
        atomic_fetch_sub(&spooled_now, 1);
    }
    free(s->buf);
    free(s);
}

void ls_hold(struct ls *s)
{
    atomic_fetch_add(&s->refs, 1);
}

/* Writes (reads) exactly n bytes at off of fd. 0, or -1 (errno). */
static int put_all(int fd, const char *p, size_t n, size_t off)
{
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w, n -= (size_t)w, off += (size_t)w;
    }
    return 0;
}

static int get_all(int fd, char *p, size_t n, size_t off)
{
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            errno = r == 0 ? EIO : errno;
            return -1;
        }
        p += r, n -= (size_t)r, off += (size_t)r;
    }
    return 0;
}

/* s's bytes [off, off + n) into out (the caller holds s->mu; off + n <= len). 0, or -1. */
static int copy_locked(const struct ls *s, size_t off, size_t n, char *out)
{
    if (s->fd >= 0)
        return get_all(s->fd, out, n, off);
    memcpy(out, s->buf + off, n);
    return 0;
}

/* An unlinked file in the spool folder (never seen by anyone else; gone with its last
 * descriptor, a crash included), or -1. */
static int spool_open(void)
{
    int fd = open(spool_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno == ENOENT) { /* made on first use, and its parent (archive_dir) */
        char parent[sizeof(spool_dir)];
        snprintf(parent, sizeof(parent), "%s", spool_dir);
        char *slash = strrchr(parent, '/');
        if (slash && slash != parent) {
            *slash = '\0';
            (void)mkdir(parent, 0700);
        }
        if (mkdir(spool_dir, 0700) == 0 || errno == EEXIST)
            fd = open(spool_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    }
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
        char path[sizeof(spool_dir) + 32];
        snprintf(path, sizeof(path), "%s/idemgate-stream-XXXXXX", spool_dir);
        fd = mkostemp(path, O_CLOEXEC);
        if (fd >= 0)
            unlink(path);
    }
    return fd;
}

/* A spooled stream keeps in memory only what is past its last scanned event: [scan, len). */
static void trim_locked(struct ls *s)
{
    if (s->fd < 0 || s->scan <= s->base)
        return;
    memmove(s->buf, s->buf + (s->scan - s->base), s->len - s->scan);
    s->base = s->scan;
    size_t keep = s->len - s->base;
    if (s->cap > 65536 && keep < s->cap / 4) {
        size_t cap = keep * 2 > 4096 ? keep * 2 : 4096;
        char *nb = realloc(s->buf, cap);
        if (nb)
            s->buf = nb, s->cap = cap;
    }
}

/* Moves a stream longer than its memory share to a spool file (the caller holds s->mu). A
 * folder that cannot take it leaves the stream in memory, as it was (said once in the log). */
static void spill_locked(struct ls *s)
{
    int fd = spool_open();
    if (fd < 0 || put_all(fd, s->buf, s->len, 0) < 0) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        if (!atomic_exchange(&spool_warned, 1))
            LOG(LOG_WARN, "stream_spool_unavailable", LS("dir", spool_dir),
                LS("error", strerror(err)),
                LS("note", "long streams are kept in memory (stream_spool_dir)"));
        s->spill_failed = 1;
        return;
    }
    s->fd = fd;
    atomic_fetch_add(&spooled_now, 1);
    trim_locked(s);
}

/* Brings a spooled stream back into memory (its file took no more). 0, or -1. */
static int unspill_locked(struct ls *s)
{
    char *nb = malloc(s->len + 1);
    if (!nb || get_all(s->fd, nb, s->len, 0) < 0) {
        free(nb);
        return -1;
    }
    free(s->buf);
    s->buf = nb;
    s->cap = s->len + 1;
    s->base = 0;
    close(s->fd);
    s->fd = -1;
    atomic_fetch_sub(&spooled_now, 1);
    return 0;
}

void ls_feed(void *arg, const char *p, size_t n)
{
    struct ls *s = arg;
    pthread_mutex_lock(&s->mu);
    s->fed += n;
    if (s->ended || s->closed) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->began = 1;
    size_t take = n;
    if (s->len + take > s->max) {
        take = s->max - s->len;
        s->ended = s->cut = 1; /* past the cap: readers get what fits, then a cut */
    }
    if (take && s->fd < 0 && mem_share && s->len + take > mem_share && !s->spill_failed)
        spill_locked(s); /* once: a spool that failed is not tried again at every piece */
    if (take && s->fd >= 0 && put_all(s->fd, p, take, s->len) < 0 &&
        (s->spill_failed = 1, unspill_locked(s) < 0))
        goto lost;
    size_t kept = s->len - s->base; /* in buf */
    if (take && kept + take > s->cap) {
        size_t cap = up_grow_cap(s->cap, kept + take, s->max); /* never past the stream's cap */
        char *nb = realloc(s->buf, cap);
        if (!nb)
            goto lost;
        s->buf = nb;
        s->cap = cap;
    }
    if (take) {
        memcpy(s->buf + kept, p, take);
        s->len += take;
        scan_locked(s);
        trim_locked(s);
    }
    wake_locked(s);
    pthread_mutex_unlock(&s->mu);
    return;
lost: /* out of memory or spool: live stops, and the record is short (ls_record says so) */
    s->ended = s->cut = 1;
    wake_locked(s);
    pthread_mutex_unlock(&s->mu);
}

int ls_record(struct ls *s, char **out, size_t *len, int *whole)
{
    pthread_mutex_lock(&s->mu);
    char *b = malloc(s->len + 1);
    int e = b ? copy_locked(s, 0, s->len, b) : -1;
    if (e == 0) {
        b[s->len] = '\0';
        *out = b;
        *len = s->len;
        *whole = s->fed == s->len;
    } else {
        free(b);
    }
    pthread_mutex_unlock(&s->mu);
    return e;
}

int ls_copy(struct ls *s, size_t off, size_t n, char *out)
{
    pthread_mutex_lock(&s->mu);
    int e = off + n <= s->len ? copy_locked(s, off, n, out) : -1;
    pthread_mutex_unlock(&s->mu);
    return e;
}

long ls_spooled(void)
{
    return atomic_load(&spooled_now);
}

void ls_settle(struct ls *s, int recorded)
{
    pthread_mutex_lock(&s->mu);
    if (!s->settled) {
        s->settled = 1;
        s->recorded = recorded;
        if (!recorded && s->held != HELD_NONE)
            s->cut = 1; /* the terminal event was never recorded: it is never given */
    }
    wake_locked(s);
    pthread_mutex_unlock(&s->mu);
}

void ls_attempt_end(struct ls *s, int cut)
{
    pthread_mutex_lock(&s->mu);
    if (s->began) {
        s->ended = 1;
        s->cut |= cut;
        /* Judged whole by its reader (sse.c) with no terminal event seen here: its end is held
         * too — what was not yet scanned, and the clean end itself — until the record's fate
         * is known. The two readings never disagree on the formats we know; if they do, a
         * client still never gets a whole answer that is not the record. */
        if (!s->cut && s->held == HELD_NONE)
            s->held = s->scan;
    }
    s->attempt_over = 1;
    wake_locked(s);
    pthread_mutex_unlock(&s->mu);
}

enum ls_at ls_read(struct ls *s, size_t pos, char *buf, size_t max, size_t *n)
{
    *n = 0;
    pthread_mutex_lock(&s->mu);
    enum ls_at at;
    size_t vis = visible_locked(s);
    if (pos < vis) {
        size_t k = vis - pos < max ? vis - pos : max;
        if (copy_locked(s, pos, k, buf) == 0) {
            *n = k;
            at = LS_BYTES;
        } else {
            at = LS_CUT; /* the spool file could not be read: this reader ends cut */
        }
    } else if (!s->began) {
        at = s->attempt_over || s->closed ? LS_NONE : LS_WAIT;
    } else if (hidden_locked(s)) {
        /* Nothing shown yet: a refusal whose write was not the job's end (backed off, sent
         * again) is a stream that never began, for its readers — they wait for the job. */
        at = s->settled || s->closed ? LS_NONE : LS_WAIT;
    } else if (end_known_locked(s)) {
        /* Closed with the terminal event held and never recorded: the readers end cut. */
        at = s->cut || (s->held != HELD_NONE && !s->recorded) ? LS_CUT : LS_END;
    } else {
        at = LS_WAIT;
    }
    pthread_mutex_unlock(&s->mu);
    return at;
}

int ls_began(struct ls *s)
{
    pthread_mutex_lock(&s->mu);
    int b = s->began;
    pthread_mutex_unlock(&s->mu);
    return b;
}

int ls_shown(struct ls *s)
{
    pthread_mutex_lock(&s->mu);
    int b = s->began && !hidden_locked(s);
    pthread_mutex_unlock(&s->mu);
    return b;
}

int ls_park(struct ls *s, struct hs_req *r, size_t pos, double deadline)
{
    struct parked *p = malloc(sizeof(*p));
    if (!p)
        return -1;
    pthread_mutex_lock(&s->mu);
    /* Stopping: a reader that checked hs_req_draining just before ls_wake_all would otherwise
     * park after it and wait for the drain's end (read under s->mu, which ls_wake_all takes
     * after setting it: either this sees it, or ls_wake_all sees the parked reader). */
    if (ready_locked(s, pos) || atomic_load(&stopping)) {
        pthread_mutex_unlock(&s->mu);
        free(p);
        return 0;
    }
    p->r = r;
    p->pos = pos;
    p->deadline = deadline;
    p->next = s->parked;
    s->parked = p;
    hs_suspend(r); /* under the lock: no wake-up can come before the suspension */
    pthread_mutex_unlock(&s->mu);
    return 1;
}

void ls_unpark(struct ls *s, struct hs_req *r)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    struct parked **pp = &s->parked;
    while (*pp) {
        if ((*pp)->r == r) {
            struct parked *p = *pp;
            *pp = p->next;
            free(p);
        } else {
            pp = &(*pp)->next;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

void ls_wake_all(void)
{
    atomic_store(&stopping, 1);
    pthread_mutex_lock(&reg_mu);
    for (size_t b = 0; b < BUCKETS; b++)
        for (struct ls *s = reg[b]; s; s = s->next) {
            pthread_mutex_lock(&s->mu);
            while (s->parked) {
                struct parked *p = s->parked;
                s->parked = p->next;
                hs_resume(p->r);
                free(p);
            }
            pthread_mutex_unlock(&s->mu);
        }
    pthread_mutex_unlock(&reg_mu);
}

size_t ls_count(void)
{
    pthread_mutex_lock(&reg_mu);
    size_t n = reg_count;
    pthread_mutex_unlock(&reg_mu);
    return n;
}
