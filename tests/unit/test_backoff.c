/* Retry timing: Retry-After and retry-after-ms parsing, delays in error bodies, full-jitter
 * backoff and the retry budget, one table row per case. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemgate/backoff.h"

#define N_ROWS(a) (sizeof(a) / sizeof((a)[0]))

/* Sun, 06 Nov 1994 08:49:37 GMT, the instant of RFC 9110's examples. */
#define NOW_1994 784111777LL
#define MAX_MS BO_DELAY_MAX_MS

struct ra_case {
    const char *in;
    long long now;
    long long want;
};

static const struct ra_case ra_seconds[] = {
    {"0", NOW_1994, 0},
    {"120", NOW_1994, 120000},
    {"007", NOW_1994, 7000},
    /* Optional whitespace around a field value is not part of it (RFC 9110 §5.5). */
    {" 120 ", NOW_1994, 120000},
    {"\t120\t", NOW_1994, 120000},
    {"-1", NOW_1994, -1},
    {"+1", NOW_1994, -1},
    {"1.5", NOW_1994, -1},
    {"1e3", NOW_1994, -1},
    {"12 0", NOW_1994, -1},
    {"120s", NOW_1994, -1},
    {"abc", NOW_1994, -1},
    {"", NOW_1994, -1},
    {"   ", NOW_1994, -1},
    {"\xef\xbc\x91", NOW_1994, -1}, /* a fullwidth digit one is not a DIGIT */
    /* Saturation: the largest value that still fits, the first that does not, and far past. */
    {"9007199254740", NOW_1994, 9007199254740000LL},
    {"9007199254741", NOW_1994, MAX_MS},
    {"99999999999999999999", NOW_1994, MAX_MS},
    {"99999999999999999999999999999999999999999999999999", NOW_1994, MAX_MS},
};

static const struct ra_case ra_dates[] = {
    /* The three forms of the same instants around a fixed now. */
    {"Sun, 06 Nov 1994 08:49:37 GMT", NOW_1994, 0},
    {"Sun, 06 Nov 1994 08:49:39 GMT", NOW_1994, 2000},
    {"Sun, 06 Nov 1994 08:49:27 GMT", NOW_1994, 0},
    {"Sunday, 06-Nov-94 08:49:37 GMT", NOW_1994, 0},
    {"Sunday, 06-Nov-94 08:49:39 GMT", NOW_1994, 2000},
    {"Sunday, 06-Nov-94 08:49:27 GMT", NOW_1994, 0},
    {"Sun Nov  6 08:49:37 1994", NOW_1994, 0},
    {"Sun Nov  6 08:49:39 1994", NOW_1994, 2000},
    {"Sun Nov  6 08:49:27 1994", NOW_1994, 0},
    {"Sun Nov 06 08:49:39 1994", NOW_1994, 2000}, /* asctime's day may also be two digits */
    {" Sun, 06 Nov 1994 08:49:39 GMT\t", NOW_1994, 2000},
    {"Mon, 07 Nov 1994 08:49:37 GMT", NOW_1994, 86400000},
    /* The day name is checked for syntax only: 6 Nov 1994 was a Sunday. */
    {"Mon, 06 Nov 1994 08:49:39 GMT", NOW_1994, 2000},
    /* With now = 0 the delay is the date's Unix time: days_from_civil against known values. */
    {"Thu, 01 Jan 1970 00:00:00 GMT", 0, 0},
    {"Thu, 01 Jan 1970 00:00:01 GMT", 0, 1000},
    {"Sun, 06 Nov 1994 08:49:37 GMT", 0, 784111777000LL},
    {"Fri, 31 Dec 1999 23:59:59 GMT", 0, 946684799000LL},
    {"Sat, 01 Jan 2000 00:00:00 GMT", 0, 946684800000LL},
    {"Tue, 29 Feb 2000 00:00:00 GMT", 0, 951782400000LL},
    {"Wed, 01 Mar 2000 00:00:00 GMT", 0, 951868800000LL},
    {"Thu, 29 Feb 2024 12:00:00 GMT", 0, 1709208000000LL},
    {"Tue, 19 Jan 2038 03:14:08 GMT", 0, 2147483648000LL},
    {"Fri, 31 Dec 9999 23:59:59 GMT", 0, 253402300799000LL},
    /* Year 0000 (a leap year, proleptic) exercises the negative-era branch. */
    {"Sat, 01 Jan 0000 00:00:05 GMT", -62167219200LL, 5000},
    {"Tue, 29 Feb 0000 00:00:00 GMT", -62167219200LL, 59LL * 86400 * 1000},
    /* A far-past now saturates instead of overflowing. */
    {"Sun, 06 Nov 1994 08:49:37 GMT", LLONG_MIN, MAX_MS},
    {"Sun, 06 Nov 1994 08:49:37 GMT", LLONG_MAX, 0},
    /* RFC 850 two-digit years fall in (now - 50 years, now + 50 years]. */
    {"Saturday, 01-Jan-00 00:00:00 GMT", 946684799LL, 1000}, /* now 1999-12-31T23:59:59 */
    {"Sunday, 06-Nov-94 08:49:37 GMT", 1767225600LL, 0},     /* now 2026: 1994, past */
    {"Wednesday, 01-Jan-76 00:00:00 GMT", 1767225600LL, (3345062400LL - 1767225600LL) * 1000},
    {"Friday, 01-Jan-77 00:00:00 GMT", 1767225600LL, 0}, /* 2077 is 51 years ahead: 1977 */
};

static const struct ra_case ra_invalid_dates[] = {
    {"Sun, 30 Feb 1994 08:49:37 GMT", 0, -1},
    {"Sun, 29 Feb 1994 08:49:37 GMT", 0, -1},
    {"Thu, 29 Feb 1900 08:49:37 GMT", 0, -1},
    {"Sun, 31 Nov 1994 08:49:37 GMT", 0, -1},
    {"Sun, 32 Dec 1994 08:49:37 GMT", 0, -1},
    {"Sun, 00 Nov 1994 08:49:37 GMT", 0, -1},
    {"Sun, 06 Nov 1994 24:00:00 GMT", 0, -1},
    {"Sun, 06 Nov 1994 08:60:37 GMT", 0, -1},
    {"Sun, 06 Nov 1994 08:49:60 GMT", 0, -1},
    {"Sun, 06 Foo 1994 08:49:37 GMT", 0, -1},
    {"Sun, 06 nov 1994 08:49:37 GMT", 0, -1},
    {"sun, 06 Nov 1994 08:49:37 GMT", 0, -1},
    {"Xyz, 06 Nov 1994 08:49:37 GMT", 0, -1},
    {"Sun, 06 Nov 1994 08:49:37", 0, -1},
    {"Sun, 06 Nov 1994 08:49:37 UTC", 0, -1},
    {"Sun, 06 Nov 1994 08:49:37 gmt", 0, -1},
    {"Sun, 06 Nov 1994 08:49:37 GMT+1", 0, -1},
    {"Sun, 06 Nov 1994 08:49:37 +0000", 0, -1},
    {"Sun, 6 Nov 1994 08:49:37 GMT", 0, -1},
    {"Sun, 06 Nov 94 08:49:37 GMT", 0, -1},
    {"Sun,  06 Nov 1994 08:49:37 GMT", 0, -1},
    {"Sun 06 Nov 1994 08:49:37 GMT", 0, -1},
    {"Sun, 06 Nov 1994 8:49:37 GMT", 0, -1},
    {"Sun, 06 Nov 1994 08:49 GMT", 0, -1},
    {"Sun, 06-Nov-94 08:49:37 GMT", 0, -1},
    {"Sunday, 06 Nov 1994 08:49:37 GMT", 0, -1},
    {"Sunday, 06-Nov-1994 08:49:37 GMT", 0, -1},
    {"Sunday, 31-Feb-94 08:49:37 GMT", 0, -1},
    {"Sun Nov 6 08:49:37 1994", 0, -1},
    {"Sun Nov  6 08:49:37 94", 0, -1},
    {"Sun Nov  6 08:49:37 1994 GMT", 0, -1},
    {"Sun Nov  0 08:49:37 1994", 0, -1},
    {"Sun Feb 29 08:49:37 1900", 0, -1},
    {"Sun", 0, -1},
    {"Sunday", 0, -1},
};

static void run_ra(const struct ra_case *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        long long got = bo_retry_after_ms(rows[i].in, rows[i].now);
        if (got != rows[i].want)
            print_error("Retry-After \"%s\" now %lld: got %lld, want %lld\n", rows[i].in,
                        rows[i].now, got, rows[i].want);
        assert_int_equal(got, rows[i].want);
    }
}

static void test_retry_after_seconds(void **state)
{
    (void)state;
    run_ra(ra_seconds, N_ROWS(ra_seconds));
    assert_int_equal(bo_retry_after_ms(NULL, NOW_1994), -1);
}

static void test_retry_after_dates(void **state)
{
    (void)state;
    run_ra(ra_dates, N_ROWS(ra_dates));
}

static void test_retry_after_invalid_dates(void **state)
{
    (void)state;
    run_ra(ra_invalid_dates, N_ROWS(ra_invalid_dates));
}

/* Leap years from the calendar rules: a 29 Feb parses exactly in the leap years. */
static void test_retry_after_leap_years(void **state)
{
    static const struct {
        int year;
        int leap;
    } years[] = {{1900, 0}, {1996, 1}, {2000, 1}, {2023, 0}, {2024, 1}, {2100, 0}, {2400, 1}};
    (void)state;
    for (size_t i = 0; i < N_ROWS(years); i++) {
        char v[64];
        snprintf(v, sizeof(v), "Mon, 29 Feb %04d 00:00:00 GMT", years[i].year);
        long long got = bo_retry_after_ms(v, 0);
        if (years[i].leap)
            assert_true(got > 0);
        else
            assert_int_equal(got, -1);
    }
}

struct ms_case {
    const char *in;
    long long want;
};

static const struct ms_case ms_cases[] = {
    {"1500", 1500},
    {"0", 0},
    {"1500.5", 1501},
    {"1500.0", 1500},
    {"1500.000000000000000000000001", 1501},
    {"0.0001", 1},
    {" 20 ", 20},
    {"-5", -1},
    {"+5", -1},
    {"x", -1},
    {"", -1},
    {"1.", -1},
    {".5", -1},
    {"1e3", -1},
    {"1,5", -1},
    {"1.5.1", -1},
    {"15 00", -1},
    {"9007199254740991.5", MAX_MS},
    {"9007199254740992", MAX_MS},
    {"99999999999999999999999", MAX_MS},
};

static void test_retry_after_ms_header(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS(ms_cases); i++) {
        long long got = bo_retry_after_ms_header(ms_cases[i].in);
        if (got != ms_cases[i].want)
            print_error("retry-after-ms \"%s\": got %lld, want %lld\n", ms_cases[i].in, got,
                        ms_cases[i].want);
        assert_int_equal(got, ms_cases[i].want);
    }
    assert_int_equal(bo_retry_after_ms_header(NULL), -1);
}

/* Number parsing must not follow LC_NUMERIC: under a locale whose decimal point is a comma,
 * "1500.5" still means 1500.5. Skipped where no such locale is installed (make unit builds one
 * under build/locale and sets LOCPATH). */
static void test_locale_independent(void **state)
{
    (void)state;
    if (!setlocale(LC_ALL, "de_DE.UTF-8") || strcmp(localeconv()->decimal_point, ",") != 0) {
        setlocale(LC_ALL, "C");
        skip();
    }
    long long ms = bo_retry_after_ms_header("1500.5");
    long long comma = bo_retry_after_ms_header("1500,5");
    long long date = bo_retry_after_ms("Sun, 06 Nov 1994 08:49:39 GMT", NOW_1994);
    struct bo_body_hint h;
    assert_int_equal(bo_body_hint_compile(&h, "try again in ([0-9]+(\\.[0-9]+)?)s", 1000, 0), 0);
    long long body = bo_body_hint_ms(&h, "Please try again in 1.5s.", 25);
    bo_body_hint_free(&h);
    setlocale(LC_ALL, "C");
    assert_int_equal(ms, 1501);
    assert_int_equal(comma, -1);
    assert_int_equal(date, 2000);
    assert_int_equal(body, 1500);
}

#define SECONDS_RE "try again in ([0-9]+(\\.[0-9]+)?)s"
#define MILLIS_RE "try again in ([0-9]+(\\.[0-9]+)?)ms"

struct body_case {
    const char *pattern;
    long long unit_ms;
    int icase;
    const char *body;
    long long want;
};

static const struct body_case body_cases[] = {
    {SECONDS_RE, 1000, 0,
     "{\"error\":{\"message\":\"Rate limit reached for gpt-image-1 in organization org-abc on "
     "images per min (IPM): Limit 5, Used 5, Requested 1. Please try again in 1.5s. Visit "
     "https://platform.openai.com/account/rate-limits to learn more.\",\"type\":\"requests\","
     "\"param\":null,\"code\":\"rate_limit_exceeded\"}}",
     1500},
    {SECONDS_RE, 1000, 0, "Please try again in 12s.", 12000},
    {SECONDS_RE, 1000, 0, "Please try again in 0.001s.", 1},
    {SECONDS_RE, 1000, 0, "Please try again in 1.0004s.", 1001},
    {SECONDS_RE, 1000, 0, "Please try again in 6m0s.", -1},
    /* "20ms" must not be read as 20 seconds by the seconds rule. */
    {SECONDS_RE, 1000, 0, "Please try again in 20ms.", -1},
    {MILLIS_RE, 1, 0, "Please try again in 20ms.", 20},
    {MILLIS_RE, 1, 0, "Please try again in 20.5ms.", 21},
    {MILLIS_RE, 1, 0, "Please try again in 1.5s.", -1},
    {"retry after ([0-9]+) seconds?", 1000, 1, "Server busy. Retry After 3 Seconds.", 3000},
    {"retry after ([0-9]+) seconds?", 1000, 0, "Server busy. Retry After 3 Seconds.", -1},
    {"retry after ([0-9]+) seconds?", 1000, 1, "retry after 1 second", 1000},
    {SECONDS_RE, 1000, 0, "{\"error\":{\"message\":\"Internal server error\"}}", -1},
    {SECONDS_RE, 1000, 0, "", -1},
    /* The captured text must be a number even when the pattern is loose. */
    {"in ([0-9.]+)s", 1000, 0, "try again in 1.2.3s", -1},
    {"in ([0-9.]+)s", 1000, 0, "try again in 2.25s", 2250},
    /* Group 1 inside an alternative that did not match gives no hint. */
    {"later|in ([0-9]+)s", 1000, 0, "try later", -1},
    {"later|in ([0-9]+)s", 1000, 0, "try in 4s", 4000},
    {"in ([0-9]+) minutes", 60000, 0, "try again in 2 minutes", 120000},
    {SECONDS_RE, 1000, 0, "Please try again in 99999999999999999999s.", MAX_MS},
};

/* Each body goes into a heap block of exactly its length, with no NUL after it, so that ASan
 * (and valgrind, which also sees reads inside libc's regexec) reports any read past the end. */
static long long hint_on_exact_copy(const struct bo_body_hint *h, const char *text, size_t len)
{
    char *buf = malloc(len ? len : 1);
    if (!buf) {
        fail();
        return -1;
    }
    memcpy(buf, text, len);
    long long got = bo_body_hint_ms(h, buf, len);
    free(buf);
    return got;
}

static void test_body_hint(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS(body_cases); i++) {
        const struct body_case *c = &body_cases[i];
        struct bo_body_hint h;
        assert_int_equal(bo_body_hint_compile(&h, c->pattern, c->unit_ms, c->icase), 0);
        assert_int_equal(h.ok, 1);
        long long got = hint_on_exact_copy(&h, c->body, strlen(c->body));
        if (got != c->want)
            print_error("body hint /%s/ on \"%s\": got %lld, want %lld\n", c->pattern, c->body, got,
                        c->want);
        bo_body_hint_free(&h);
        assert_int_equal(h.ok, 0);
        assert_int_equal(got, c->want);
    }
}

/* The match is confined to (ptr, len): bytes past len are not part of the body, and bytes
 * inside it, NUL included, are. */
static void test_body_hint_bounds(void **state)
{
    struct bo_body_hint h;
    (void)state;
    assert_int_equal(bo_body_hint_compile(&h, SECONDS_RE, 1000, 0), 0);

    static const char text[] = "try again in 7s";
    size_t n = sizeof(text) - 1;
    assert_int_equal(hint_on_exact_copy(&h, text, n), 7000);
    assert_int_equal(hint_on_exact_copy(&h, text, n - 1), -1); /* the "s" is outside */
    assert_int_equal(bo_body_hint_ms(&h, "try again in 25s", 14), -1);
    assert_int_equal(bo_body_hint_ms(&h, "try again in 25s", 16), 25000);

    static const char with_nul[] = "{\"a\":\"\0\"} try again in 3s";
    assert_int_equal(hint_on_exact_copy(&h, with_nul, sizeof(with_nul) - 1), 3000);

    assert_int_equal(bo_body_hint_ms(&h, NULL, 0), -1);
    assert_int_equal(bo_body_hint_ms(&h, NULL, 5), -1);
    assert_int_equal(bo_body_hint_ms(NULL, text, n), -1);

    /* Only the first BO_BODY_HINT_MAX_SCAN bytes are searched. */
    size_t big = BO_BODY_HINT_MAX_SCAN + 4096;
    char *buf = malloc(big);
    if (!buf) {
        fail();
        return;
    }
    memset(buf, 'x', big);
    memcpy(buf + 100, text, n);
    assert_int_equal(bo_body_hint_ms(&h, buf, big), 7000);
    memset(buf, 'x', big);
    memcpy(buf + BO_BODY_HINT_MAX_SCAN - n, text, n);
    assert_int_equal(bo_body_hint_ms(&h, buf, big), 7000);
    memset(buf, 'x', big);
    memcpy(buf + BO_BODY_HINT_MAX_SCAN - n + 1, text, n);
    assert_int_equal(bo_body_hint_ms(&h, buf, big), -1);
    free(buf);

    bo_body_hint_free(&h);
    bo_body_hint_free(&h); /* a second free is harmless */
    assert_int_equal(bo_body_hint_ms(&h, text, n), -1);
}

static void test_body_hint_compile_errors(void **state)
{
    struct bo_body_hint h;
    (void)state;
    assert_int_equal(bo_body_hint_compile(&h, "try again in ([0-9]+", 1000, 0), -1);
    assert_int_equal(h.ok, 0);
    bo_body_hint_free(&h); /* harmless after a failed compile */
    assert_int_equal(bo_body_hint_compile(&h, "try again in [0-9]+s", 1000, 0), -1);
    assert_int_equal(h.ok, 0);
    assert_int_equal(bo_body_hint_compile(&h, SECONDS_RE, 0, 0), -1);
    assert_int_equal(bo_body_hint_compile(&h, SECONDS_RE, -1000, 0), -1);
    assert_int_equal(bo_body_hint_compile(&h, SECONDS_RE, MAX_MS + 1, 0), -1);
    assert_int_equal(bo_body_hint_compile(&h, NULL, 1000, 0), -1);
    assert_int_equal(bo_body_hint_compile(NULL, SECONDS_RE, 1000, 0), -1);
    assert_int_equal(bo_body_hint_ms(&h, "try again in 1s", 15), -1);
    /* Patterns glibc would expand exponentially (fuzzing found "g++++…" taking 1.5 GB). */
    static const char *const wild[] = {
        "try ag+++++++++++++++++++++++++++++++++ain in ([0-9]+)s", "in ([0-9]+)*+s",
        "in ([0-9]+){2}{2}s", "in ([0-9]{17})s", "a{1}b{1}c{1}in ([0-9]+)s",
        "((((((((((in ([0-9]+)s))))))))))",
    };
    for (size_t i = 0; i < sizeof(wild) / sizeof(wild[0]); i++)
        assert_int_equal(bo_body_hint_compile(&h, wild[i], 1000, 0), -1);
    /* Escaped and bracketed quantifier characters are atoms, not quantifiers. */
    assert_int_equal(bo_body_hint_compile(&h, "in ([0-9+*]+)\\+s{1,2}", 1000, 0), 0);
    bo_body_hint_free(&h);

    /* The largest unit still scales exactly and saturates instead of overflowing. */
    assert_int_equal(bo_body_hint_compile(&h, "in ([0-9.]+)u", MAX_MS, 0), 0);
    assert_int_equal(bo_body_hint_ms(&h, "in 0.5u", 7), MAX_MS / 2);
    assert_int_equal(bo_body_hint_ms(&h, "in 1.5u", 7), MAX_MS);
    bo_body_hint_free(&h);
}

/* The largest double below 1: what a generator returning [0, 1) can return at most. */
#define JUST_BELOW_1 0x1.fffffffffffffp-1

struct jitter_case {
    int attempt;
    long long base, cap;
    double rand01;
    long long hint, want;
};

static const struct jitter_case jitter_cases[] = {
    /* rand01 = 0 gives no delay, or the hint. */
    {0, 100, 10000, 0.0, -1, 0},
    {5, 100, 10000, 0.0, -1, 0},
    {0, 100, 10000, 0.0, 250, 250},
    /* Just below 1 gives ceiling - 1. */
    {0, 100, 10000, JUST_BELOW_1, -1, 99},
    {3, 100, 10000, JUST_BELOW_1, -1, 799},
    {10, 100, 10000, JUST_BELOW_1, -1, 9999},
    /* Growth by attempt with rand01 = 0.5, then the cap. */
    {0, 100, 10000, 0.5, -1, 50},
    {1, 100, 10000, 0.5, -1, 100},
    {2, 100, 10000, 0.5, -1, 200},
    {3, 100, 10000, 0.5, -1, 400},
    {4, 100, 10000, 0.5, -1, 800},
    {5, 100, 10000, 0.5, -1, 1600},
    {6, 100, 10000, 0.5, -1, 3200},
    {7, 100, 10000, 0.5, -1, 5000},
    {8, 100, 10000, 0.5, -1, 5000},
    {0, 100, 50, 0.5, -1, 25}, /* a cap below the base wins from the start */
    {3, 125, 1000, 0.5, -1, 500},
    {3, 126, 1000, 0.5, -1, 500},
    {3, 124, 1000, 0.5, -1, 496},
    /* The hint is a floor, and is honoured unchanged above the cap. */
    {2, 100, 10000, 0.5, 1000, 1000},
    {2, 100, 10000, 0.5, 100, 200},
    {2, 100, 10000, 0.5, 200, 200},
    {0, 100, 1000, 0.5, 60000, 60000},
    {0, 100, 1000, 0.5, 0, 50},
    {0, 100, 1000, 0.0, 0, 0},
    {0, 100, 1000, 0.5, MAX_MS, MAX_MS},
    /* Attempts far past the width of a long long saturate at the cap. */
    {62, 100, 30000, 0.5, -1, 15000},
    {63, 100, 30000, 0.5, -1, 15000},
    {64, 100, 30000, 0.5, -1, 15000},
    {1000, 100, 30000, 0.5, -1, 15000},
    {INT_MAX, 100, 30000, 0.5, -1, 15000},
    {INT_MAX, 100, 30000, JUST_BELOW_1, -1, 29999},
    {61, 1, LLONG_MAX, 0.5, -1, 1LL << 60},
    {62, 1, LLONG_MAX, 0.5, -1, 1LL << 61},
    {62, 2, LLONG_MAX, 0.5, -1, LLONG_MAX / 2 + 1},
    {63, 1, LLONG_MAX, 0.5, -1, LLONG_MAX / 2 + 1},
    {64, 1, LLONG_MAX, 0.5, -1, LLONG_MAX / 2 + 1},
    {INT_MAX, LLONG_MAX, LLONG_MAX, JUST_BELOW_1, -1, LLONG_MAX - 1023},
    {INT_MAX, LLONG_MAX, LLONG_MAX, 1.0, -1, LLONG_MAX - 1},
    /* Out-of-contract inputs are clamped, never undefined. */
    {-1, 100, 10000, 0.5, -1, 50},
    {INT_MIN, 100, 10000, 0.5, -1, 50},
    {3, 0, 10000, 0.5, -1, 0},
    {3, -100, 10000, 0.5, -1, 0},
    {3, 100, 0, 0.5, -1, 0},
    {3, 100, -5, 0.5, -1, 0},
    {3, 100, 10000, -0.5, -1, 0},
    {3, 100, 10000, 1.0, -1, 799},
    {3, 100, 10000, 7.0, -1, 799},
    {3, 100, 10000, INFINITY, -1, 799},
    {3, 100, 10000, -INFINITY, -1, 0},
    {3, 100, 10000, NAN, -1, 0},
    {3, 100, 10000, NAN, 42, 42},
};

static void test_full_jitter(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS(jitter_cases); i++) {
        const struct jitter_case *c = &jitter_cases[i];
        long long got = bo_full_jitter_ms(c->attempt, c->base, c->cap, c->rand01, c->hint);
        if (got != c->want)
            print_error("jitter row %zu (attempt %d base %lld cap %lld rand %g hint %lld): got "
                        "%lld, want %lld\n",
                        i, c->attempt, c->base, c->cap, c->rand01, c->hint, got, c->want);
        assert_int_equal(got, c->want);
    }
}

/* Without a hint the delay stays in [0, ceiling) for any rand01 in [0, 1). */
static void test_full_jitter_range(void **state)
{
    (void)state;
    for (int attempt = 0; attempt < 70; attempt++) {
        long long ceiling = attempt < 40 ? 3LL << attempt : 3LL << 40;
        if (ceiling > 1000000000000LL)
            ceiling = 1000000000000LL;
        for (int k = 0; k < 1000; k++) {
            double r = k / 1000.0;
            long long got = bo_full_jitter_ms(attempt, 3, 1000000000000LL, r, -1);
            assert_true(got >= 0);
            assert_true(got < ceiling);
        }
        assert_int_equal(bo_full_jitter_ms(attempt, 3, 1000000000000LL, JUST_BELOW_1, -1),
                         ceiling - 1);
    }
}

struct budget_case {
    int made, max;
    long long elapsed, deadline, delay;
    int want;
};

static const struct budget_case budget_cases[] = {
    /* The attempt limit. */
    {1, 3, 0, 10000, 1000, 1},
    {2, 3, 0, 10000, 1000, 1},
    {3, 3, 0, 10000, 1000, 0},
    {4, 3, 0, 10000, 1000, 0},
    {0, 1, 0, 10000, 0, 1},
    {1, 1, 0, 10000, 0, 0},
    {1, 0, 0, 10000, 0, 0},
    {INT_MAX - 1, INT_MAX, 0, 10000, 0, 1},
    {INT_MAX, INT_MAX, 0, 10000, 0, 0},
    /* The deadline: elapsed + delay == deadline is still inside. */
    {1, 3, 9000, 10000, 999, 1},
    {1, 3, 9000, 10000, 1000, 1},
    {1, 3, 9000, 10000, 1001, 0},
    {1, 3, 10000, 10000, 0, 1},
    {1, 3, 10000, 10000, 1, 0},
    {1, 3, 10001, 10000, 0, 0},
    {1, 3, 0, 0, 0, 1},
    {1, 3, 0, 0, 1, 0},
    {1, 3, 0, 10000, 60000, 0}, /* a hint beyond the deadline */
    /* Sums that would overflow are compared exactly. */
    {1, 3, LLONG_MAX, LLONG_MAX, 0, 1},
    {1, 3, LLONG_MAX, LLONG_MAX, 1, 0},
    {1, 3, 1, LLONG_MAX, LLONG_MAX, 0},
    {1, 3, 0, LLONG_MAX, LLONG_MAX, 1},
    {1, 3, LLONG_MAX - 1, LLONG_MAX, MAX_MS, 0},
    /* Negative inputs. */
    {1, 3, -5, 100, 100, 1},
    {1, 3, -5, 100, 101, 0},
    {1, 3, 100, 100, -1, 1},
    {1, 3, 0, -1, 0, 0},
    {1, 3, LLONG_MIN, LLONG_MIN, LLONG_MIN, 0},
};

static void test_budget(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS(budget_cases); i++) {
        const struct budget_case *c = &budget_cases[i];
        int got = bo_budget_allows(c->made, c->max, c->elapsed, c->deadline, c->delay);
        if (got != c->want)
            print_error("budget row %zu: got %d, want %d\n", i, got, c->want);
        assert_int_equal(got, c->want);
    }
}

/* The result write's window (lease.c, finish_run): the lease left, the reaped row's grace and a
 * margin, never less than the floor. */
static void test_result_write_window(void **state)
{
    (void)state;
    static const struct {
        double lease, grace, want;
    } rows[] = {
        {180, 10, 220},   /* the default lease: past the 120 s floor */
        {60, 10, 120},    /* a short lease: the floor */
        {0, 10, 120},     /* no lease known (a result built without a claim) */
        {-5, 10, 120},    /* a lease already over by the database's clock */
        {3600, 10, 3640}, /* the longest lease */
        {99999, 10, 3640}, /* past it: an hour */
        {180, -1, 210},   /* no grace */
    };
    for (size_t i = 0; i < N_ROWS(rows); i++) {
        double got = bo_result_write_window_s(rows[i].lease, rows[i].grace);
        if (got != rows[i].want)
            fail_msg("row %zu: got %g, want %g", i, got, rows[i].want);
    }
}

static void test_result_write_gives_up(void **state)
{
    (void)state;
    static const struct {
        int past, outage, unreachable, stopping, want;
    } rows[] = {
        {0, 0, 0, 0, 0}, {0, 0, 1, 0, 0}, {0, 0, 1, 1, 0}, {0, 0, 0, 1, 0},
        /* past the window: an error the server answered gives up; a database that cannot be
         * connected to is waited for, unless the process stops or the outage's bound passed */
        {1, 0, 0, 0, 1}, {1, 0, 1, 0, 0}, {1, 0, 1, 1, 1}, {1, 0, 0, 1, 1},
        {1, 1, 1, 0, 1}, {1, 1, 0, 0, 1},
    };
    for (size_t i = 0; i < N_ROWS(rows); i++)
        if (bo_result_write_gives_up(rows[i].past, rows[i].outage, rows[i].unreachable,
                                     rows[i].stopping) != rows[i].want)
            fail_msg("row %zu", i);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_retry_after_seconds),
        cmocka_unit_test(test_retry_after_dates),
        cmocka_unit_test(test_retry_after_invalid_dates),
        cmocka_unit_test(test_retry_after_leap_years),
        cmocka_unit_test(test_retry_after_ms_header),
        cmocka_unit_test(test_locale_independent),
        cmocka_unit_test(test_body_hint),
        cmocka_unit_test(test_body_hint_bounds),
        cmocka_unit_test(test_body_hint_compile_errors),
        cmocka_unit_test(test_full_jitter),
        cmocka_unit_test(test_full_jitter_range),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_result_write_window),
        cmocka_unit_test(test_result_write_gives_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
