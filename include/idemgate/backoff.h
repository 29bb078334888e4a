#ifndef IDEMGATE_BACKOFF_H
#define IDEMGATE_BACKOFF_H

#include <regex.h>
#include <stddef.h>

/* Retry timing for outbound calls to providers, as pure functions: nothing here reads a clock
 * or a random source, so the caller passes the current time and a random value, and every
 * decision can be replayed in a test. All delays are in milliseconds; -1 means "no usable value"
 * (malformed or absent), which the caller treats as "no server hint". */

/* The largest delay any parser here returns: 2^53 ms (about 285,000 years). Huge inputs saturate
 * to it instead of overflowing, and it leaves headroom so that a caller adding it to an elapsed
 * time or a timestamp in milliseconds cannot overflow a long long. */
#define BO_DELAY_MAX_MS (1LL << 53)

/* The most bytes of a body that bo_body_hint_ms looks at; the rest is ignored. Provider error
 * messages are short, and the bound keeps the regex cost of a huge body small. */
#define BO_BODY_HINT_MAX_SCAN ((size_t)64 * 1024)

/* Parses a Retry-After field value (RFC 9110 §10.2.3) and returns the delay it asks for in
 * milliseconds, or -1 when the value is malformed or NULL. Surrounding spaces and tabs are
 * trimmed (HTTP field-value trimming); nothing else is tolerated.
 * - delay-seconds: 1*DIGIT, no sign, no fraction; values past BO_DELAY_MAX_MS saturate to it.
 * - HTTP-date in any of its three forms, parsed by hand and independently of the process locale:
 *   IMF-fixdate "Sun, 06 Nov 1994 08:49:37 GMT", RFC 850 "Sunday, 06-Nov-94 08:49:37 GMT" and
 *   asctime "Sun Nov  6 08:49:37 1994". Day and month names and "GMT" are case-sensitive, as
 *   the RFC's grammar says; the day name must be a valid name but is not checked against the
 *   date (as most HTTP stacks do). The calendar date and the time must exist: 29 Feb only in
 *   leap years, hour 00..23, minute and second 00..59 (a leap second ":60" is refused, since
 *   Unix time has none). An RFC 850 two-digit year is taken in the century of now_unix, or the
 *   one before when that would put it more than 50 years ahead (RFC 9110 §5.6.7).
 * The delay of a date is (date - now_unix) seconds, 0 when the date is now or in the past. */
long long bo_retry_after_ms(const char *value, long long now_unix);

/* Parses a retry-after-ms field value: a non-negative decimal number of milliseconds,
 * 1*DIGIT [ "." 1*DIGIT ] after trimming spaces and tabs, a fraction rounding up ("1500.5" gives
 * 1501, "0.0001" gives 1). Returns the delay, saturated at BO_DELAY_MAX_MS, or -1 when the value
 * is malformed or NULL (a sign, an exponent, "1.", ".5"). The parse ignores the locale. */
long long bo_retry_after_ms_header(const char *value);

/* A compiled rule that finds a delay written in words in an error body, e.g. OpenAI's "Please try
 * again in 1.5s". Callers may read `ok` but should otherwise treat the fields as private. A
 * compiled hint is read-only during matching and may be shared by threads. */
struct bo_body_hint {
    regex_t re;
    long long unit_ms; /* milliseconds per unit of the captured number: 1000 for seconds */
    int ok;            /* 1 between a successful compile and the matching free */
};

/* Compiles pattern, a POSIX extended regular expression, into *h (caller storage). Capture group
 * 1 must hold the number, 1*DIGIT [ "." 1*DIGIT ]; further groups are allowed and ignored, so
 * that an optional fraction can be written as a nested group, e.g.
 * "try again in ([0-9]+(\\.[0-9]+)?)s" with unit_ms 1000, or the same ending in "ms" with unit_ms
 * 1. icase non-zero makes the match case-insensitive. unit_ms must be in 1..BO_DELAY_MAX_MS.
 * Returns 0, or -1 when the pattern does not compile, has no capture group, or unit_ms is out of
 * range; on failure h->ok is 0 and nothing needs freeing. Each successful compile needs one
 * bo_body_hint_free. */
__attribute__((warn_unused_result)) int
bo_body_hint_compile(struct bo_body_hint *h, const char *pattern, long long unit_ms, int icase);

/* Releases what bo_body_hint_compile allocated. Safe on a zero-initialised hint, on one whose
 * compile failed, and when called twice. */
void bo_body_hint_free(struct bo_body_hint *h);

/* Looks for the first match of h in the body (ptr, len), which need not be NUL-terminated and may
 * contain NUL bytes; only the first BO_BODY_HINT_MAX_SCAN bytes are searched, in a private
 * NUL-terminated copy (one allocation, freed before returning). Returns the captured number times
 * unit_ms, rounded up to a whole millisecond and saturated at BO_DELAY_MAX_MS, or -1 when h is
 * not compiled, nothing matches, the captured text is not a number of the form above, or the
 * copy cannot be allocated. */
long long bo_body_hint_ms(const struct bo_body_hint *h, const char *body, size_t len);

/* Full-jitter exponential backoff ("Exponential Backoff And Jitter", AWS Architecture Blog):
 * ceiling = min(cap_ms, base_ms * 2^attempt), computed without overflow for any attempt;
 * delay = floor(rand01 * ceiling), always below the ceiling when the ceiling is positive; result =
 * max(delay, hint_ms). attempt counts from 0 (a negative attempt counts as 0); a negative base_ms
 * or cap_ms counts as 0. rand01 is the caller's uniform random value in [0, 1): a value below 0
 * or NaN counts as 0, and 1 or more counts as just below 1. hint_ms is the server's hint (from
 * the parsers above), or negative for none; a hint is returned unchanged even when it exceeds
 * cap_ms, because the server knows best: the caller compares the result with its deadline
 * (bo_budget_allows) rather than shortening it. */
long long bo_full_jitter_ms(int attempt, long long base_ms, long long cap_ms, double rand01,
                            long long hint_ms);

/* Decides whether another attempt may be scheduled: returns 1 when attempts_made < max_attempts
 * and elapsed_ms + delay_ms <= deadline_ms (compared without overflow), else 0. attempts_made is
 * the number of transport attempts already made (1 after the first send), elapsed_ms the time
 * since the operation's first send, deadline_ms the total budget and delay_ms the delay about to
 * be used. A negative elapsed_ms or delay_ms counts as 0 (a clock step must not buy time); a
 * negative deadline_ms allows nothing. */
int bo_budget_allows(int attempts_made, int max_attempts, long long elapsed_ms,
                     long long deadline_ms, long long delay_ms);

/* How long a result write keeps trying while the database cannot be reached (lease.c), in
 * seconds from when it first tries: at least BO_RESULT_WRITE_MIN_S, and as long as the write may
 * still be accepted — the lease left when it was claimed (lease_remaining_s, an upper bound of
 * what is left now), then the grace a reaped row keeps for its worker's late result
 * (reap_grace_s) and a margin for the reaper's own interval. Before, every write gave up after
 * 120 s: a paid result was dropped while its lease (180 s by default) still held, the job
 * reconciled without it. Giving up after the write is fenced changes nothing; giving up before
 * loses a paid answer. A negative lease counts as none, one over an hour as an hour. */
#define BO_RESULT_WRITE_MIN_S 120.0
#define BO_RESULT_WRITE_MARGIN_S 30.0
double bo_result_write_window_s(double lease_remaining_s, double reap_grace_s);

/* Whether a result write that failed for the database (lost, or asked to retry) stops trying:
 * past its window (bo_result_write_window_s), unless the database could not even be connected to
 * — most likely nobody reaches it either (a failover, a crash recovery longer than the window),
 * and giving up would drop a paid answer the outage merely delayed; a late write is accepted or
 * fenced, never wrong — and then until BO_RESULT_WRITE_OUTAGE_S past the window: a refusal only
 * this replica meets (its pooler full, a credential it missed) must not hold its thread for
 * ever. A stopping process gives up past the window anyway. Pure. */
#define BO_RESULT_WRITE_OUTAGE_S 1800.0
int bo_result_write_gives_up(int past_window, int past_outage, int unreachable, int stopping);

#endif
