#include "idemgate/backoff.h"

#include <stdlib.h>
#include <string.h>

/* Every parser here works on a [p, end) range and compares bytes explicitly instead of using
 * <ctype.h>, strtoll, strtod or strptime: all of those consult the process locale, and a header
 * value must mean the same thing whatever locale the gateway runs in. */

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Drops HTTP optional whitespace (SP and HTAB) from both ends of [*p, *end). */
static void trim_ows(const char **p, const char **end)
{
    while (*p < *end && (**p == ' ' || **p == '\t'))
        (*p)++;
    while (*end > *p && ((*end)[-1] == ' ' || (*end)[-1] == '\t'))
        (*end)--;
}

/* Parses [p, end) as 1*DIGIT, or 1*DIGIT "." 1*DIGIT when allow_fraction is set, and stores the
 * number times unit (1..BO_DELAY_MAX_MS) rounded up and saturated at BO_DELAY_MAX_MS in *out.
 * Returns 0, or -1 when the range is not such a number. The scaling is exact in integers: a
 * decimal fraction times a unit is not representable in a double, and "1.0004s" must round up
 * to 1001 ms, not down through a binary approximation. */
static int scale_decimal(const char *p, const char *end, int allow_fraction, long long unit,
                         long long *out)
{
    long long ip = 0;
    int saturated = 0;
    const char *frac = NULL;
    const char *frac_end = NULL;

    if (p == end || !is_digit(*p))
        return -1;
    for (; p < end && is_digit(*p); p++) {
        if (saturated)
            continue;
        /* ip <= BO_DELAY_MAX_MS here, so ip * 10 + 9 cannot overflow a long long. */
        ip = ip * 10 + (*p - '0');
        if (ip > BO_DELAY_MAX_MS)
            saturated = 1;
    }
    if (p < end && *p == '.') {
        if (!allow_fraction)
            return -1;
        frac = ++p;
        while (p < end && is_digit(*p))
            p++;
        frac_end = p;
        if (frac == frac_end)
            return -1;
    }
    if (p != end)
        return -1;

    if (saturated || ip > BO_DELAY_MAX_MS / unit) {
        *out = BO_DELAY_MAX_MS;
        return 0;
    }
    long long ms = ip * unit;
    if (frac) {
        /* Horner's rule from the last digit: 0.d1..dn * unit = (d1 * unit + (d2 * unit + ...)
         * / 10) / 10. Keeping the integer part q (always below unit) and whether any remainder
         * was dropped gives the exact ceiling for any number of digits. */
        long long q = 0;
        int inexact = 0;
        for (const char *d = frac_end; d > frac;) {
            d--;
            long long t = (*d - '0') * unit + q;
            if (t % 10)
                inexact = 1;
            q = t / 10;
        }
        ms += q + inexact;
        if (ms > BO_DELAY_MAX_MS)
            ms = BO_DELAY_MAX_MS;
    }
    *out = ms;
    return 0;
}

/* Returns the number of days from 1970-01-01 to the proleptic Gregorian date y-m-d (m 1..12,
 * d 1..31), negative before the epoch. This is Howard Hinnant's days_from_civil: eras of 400
 * years (146097 days) make it exact for any year without a table or a loop. */
static long long days_from_civil(long long y, int m, int d)
{
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    long long yoe = y - era * 400;                                   /* [0, 399] */
    long long doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1; /* [0, 365] */
    long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;           /* [0, 146096] */
    return era * 146097 + doe - 719468;
}

/* Returns the proleptic Gregorian year of the day that is z days after 1970-01-01: the inverse
 * of days_from_civil as far as the year goes (Hinnant's civil_from_days). */
static long long year_from_days(long long z)
{
    z += 719468;
    long long era = (z >= 0 ? z : z - 146096) / 146097;
    long long doe = z - era * 146097;
    long long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    long long mp = (5 * doy + 2) / 153;
    return yoe + era * 400 + (mp >= 10); /* March-based months 10 and 11 are Jan and Feb */
}

static int is_leap(long long y)
{
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static int days_in_month(long long y, int m)
{
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return m == 2 && is_leap(y) ? 29 : days[m - 1];
}

/* The Unix seconds of 0000-01-01T00:00:00Z and 9999-12-31T23:59:59Z, the range of a four-digit
 * year. */
#define UNIX_YEAR_0 (-62167219200LL)
#define UNIX_YEAR_9999_END 253402300799LL

struct cursor {
    const char *p;
    const char *end;
};

/* Consumes the literal s when the input starts with it; returns 1 if it did. */
static int take_lit(struct cursor *c, const char *s)
{
    size_t n = strlen(s);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, s, n) != 0)
        return 0;
    c->p += n;
    return 1;
}

/* Consumes exactly n digits into *out; returns 1 if there were n. */
static int take_digits(struct cursor *c, int n, int *out)
{
    int v = 0;
    if (c->end - c->p < n)
        return 0;
    for (int i = 0; i < n; i++) {
        if (!is_digit(c->p[i]))
            return 0;
        v = v * 10 + (c->p[i] - '0');
    }
    c->p += n;
    *out = v;
    return 1;
}

/* Consumes one of the count names (case-sensitive) and returns its index, or -1. No name in
 * the tables below is a prefix of another name in the same table. */
static int take_name(struct cursor *c, const char *const *names, int count)
{
    for (int i = 0; i < count; i++)
        if (take_lit(c, names[i]))
            return i;
    return -1;
}

static const char *const day_short[7] = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
static const char *const day_long[7] = {"Monday", "Tuesday",  "Wednesday", "Thursday",
                                        "Friday", "Saturday", "Sunday"};
static const char *const month_names[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

/* Consumes time-of-day, "HH:MM:SS", without checking the ranges. */
static int take_time(struct cursor *c, int *hh, int *mm, int *ss)
{
    return take_digits(c, 2, hh) && take_lit(c, ":") && take_digits(c, 2, mm) && take_lit(c, ":") &&
           take_digits(c, 2, ss);
}

/* Parses an HTTP-date (RFC 9110 §5.6.7) occupying all of [p, end) into Unix seconds. Returns 0,
 * or -1 when the syntax or the calendar is wrong. now_unix is needed only to place the two-digit
 * year of the RFC 850 form. */
static int parse_http_date(const char *p, const char *end, long long now_unix, long long *out)
{
    struct cursor c = {p, end};
    long long year;
    int y = 0, mon, day = 0, hh = 0, mm = 0, ss = 0;

    /* The long day names go first: "Sunday" starts with "Sun", and only what follows the name
     * tells the forms apart. */
    if (take_name(&c, day_long, 7) >= 0) {
        /* rfc850-date = day-name-l ", " DD "-" Mon "-" YY SP time-of-day " GMT" */
        int yy;
        if (!take_lit(&c, ", ") || !take_digits(&c, 2, &day) || !take_lit(&c, "-") ||
            (mon = take_name(&c, month_names, 12)) < 0 || !take_lit(&c, "-") ||
            !take_digits(&c, 2, &yy) || !take_lit(&c, " ") || !take_time(&c, &hh, &mm, &ss) ||
            !take_lit(&c, " GMT"))
            return -1;
        /* RFC 9110: a two-digit year that appears more than 50 years in the future means the
         * most recent past year with the same last two digits. Read with the usual sliding
         * window, the year is the one with those digits in (now - 50, now + 50], so that "00"
         * seen late in 1999 is 2000, not 1900. The year of now is taken from a clamped now so
         * that an absurd clock cannot overflow the arithmetic. */
        long long now = now_unix;
        if (now < UNIX_YEAR_0)
            now = UNIX_YEAR_0;
        if (now > UNIX_YEAR_9999_END)
            now = UNIX_YEAR_9999_END;
        long long now_days = now / 86400 - (now % 86400 < 0);
        long long now_year = year_from_days(now_days);
        long long century = now_year / 100 * 100;
        year = century + yy;
        if (year > now_year + 50)
            year -= 100;
        else if (year <= now_year - 50)
            year += 100;
    } else if (take_name(&c, day_short, 7) >= 0) {
        if (take_lit(&c, ", ")) {
            /* IMF-fixdate = day-name ", " DD SP Mon SP YYYY SP time-of-day " GMT" */
            if (!take_digits(&c, 2, &day) || !take_lit(&c, " ") ||
                (mon = take_name(&c, month_names, 12)) < 0 || !take_lit(&c, " ") ||
                !take_digits(&c, 4, &y) || !take_lit(&c, " ") || !take_time(&c, &hh, &mm, &ss) ||
                !take_lit(&c, " GMT"))
                return -1;
        } else if (take_lit(&c, " ")) {
            /* asctime-date = day-name SP Mon SP ( DD / SP D ) SP time-of-day SP YYYY */
            if ((mon = take_name(&c, month_names, 12)) < 0 || !take_lit(&c, " "))
                return -1;
            if (take_lit(&c, " ") ? !take_digits(&c, 1, &day) : !take_digits(&c, 2, &day))
                return -1;
            if (!take_lit(&c, " ") || !take_time(&c, &hh, &mm, &ss) || !take_lit(&c, " ") ||
                !take_digits(&c, 4, &y))
                return -1;
        } else {
            return -1;
        }
        year = y;
    } else {
        return -1;
    }
    if (c.p != c.end)
        return -1;

    mon += 1;
    if (day < 1 || day > days_in_month(year, mon) || hh > 23 || mm > 59 || ss > 59)
        return -1;
    *out = days_from_civil(year, mon, day) * 86400 + hh * 3600 + mm * 60 + ss;
    return 0;
}

long long bo_retry_after_ms(const char *value, long long now_unix)
{
    if (!value)
        return -1;
    const char *p = value;
    const char *end = value + strlen(value);
    trim_ows(&p, &end);
    if (p == end)
        return -1;

    if (is_digit(*p)) {
        long long ms;
        return scale_decimal(p, end, 0, 1000, &ms) == 0 ? ms : -1;
    }

    long long t;
    if (parse_http_date(p, end, now_unix, &t) != 0)
        return -1;
    if (t <= now_unix)
        return 0;
    /* t is within the four-digit years, so t - BO_DELAY_MAX_MS / 1000 cannot overflow, while
     * t - now_unix could for a now far in the past. */
    if (now_unix < t - BO_DELAY_MAX_MS / 1000)
        return BO_DELAY_MAX_MS;
    return (t - now_unix) * 1000;
}

long long bo_retry_after_ms_header(const char *value)
{
    if (!value)
        return -1;
    const char *p = value;
    const char *end = value + strlen(value);
    long long ms;
    trim_ows(&p, &end);
    return scale_decimal(p, end, 1, 1, &ms) == 0 ? ms : -1;
}

/* Whether glibc can compile pattern in bounded memory. Its regcomp copies the tree of a
 * repeated subexpression once per repetition (and `x+` as `xx*`), so stacked quantifiers
 * ("g++++…": found by fuzzing, 1.5 GB), deep nests of repeated groups or large {m,n} bounds
 * grow exponentially. A delay hint needs none of these. */
static int pattern_tame(const char *p)
{
    size_t len = strlen(p);
    int depth = 0, braces = 0, after_quantifier = 0;
    if (len > 256)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < len) { /* an escaped character is an atom */
            i++;
            after_quantifier = 0;
        } else if (c == '[') { /* a bracket expression is an atom */
            size_t j = i + 1;
            if (j < len && p[j] == '^')
                j++;
            if (j < len && p[j] == ']')
                j++;
            while (j < len && p[j] != ']')
                j++;
            i = j;
            after_quantifier = 0;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (after_quantifier)
                return 0;
            if (c == '{') {
                char *end;
                long lo = strtol(p + i + 1, &end, 10), hi = lo;
                if (*end == ',')
                    hi = end[1] == '}' ? 0 : strtol(end + 1, &end, 10);
                if (++braces > 2 || lo > 16 || hi > 16 || hi < 0 || (*end != '}' && *end != ','))
                    return 0;
                while (i < len && p[i] != '}')
                    i++;
            }
            after_quantifier = 1;
        } else {
            if (c == '(' && ++depth > 8)
                return 0;
            if (c == ')')
                depth--;
            after_quantifier = 0;
        }
    }
    return 1;
}

int bo_body_hint_compile(struct bo_body_hint *h, const char *pattern, long long unit_ms, int icase)
{
    if (!h)
        return -1;
    h->ok = 0;
    h->unit_ms = 0;
    if (!pattern || unit_ms < 1 || unit_ms > BO_DELAY_MAX_MS || !pattern_tame(pattern))
        return -1;
    if (regcomp(&h->re, pattern, REG_EXTENDED | (icase ? REG_ICASE : 0)) != 0)
        return -1;
    if (h->re.re_nsub < 1) {
        regfree(&h->re);
        return -1;
    }
    h->unit_ms = unit_ms;
    h->ok = 1;
    return 0;
}

void bo_body_hint_free(struct bo_body_hint *h)
{
    if (!h || !h->ok)
        return;
    regfree(&h->re);
    h->ok = 0;
}

long long bo_body_hint_ms(const struct bo_body_hint *h, const char *body, size_t len)
{
    regmatch_t m[2];
    long long ms = -1;

    if (!h || !h->ok || (!body && len > 0))
        return -1;
    if (len > BO_BODY_HINT_MAX_SCAN)
        len = BO_BODY_HINT_MAX_SCAN;
    /* glibc's REG_STARTEND alone would let regexec read exactly [0, len) of the caller's bytes,
     * but the ASan interceptor of regexec (gcc 12) still runs strlen over the string first and
     * reads past an unterminated body. A NUL-terminated copy is safe under both; REG_STARTEND
     * on the copy keeps NUL bytes inside the body ordinary characters instead of its end. */
    char *copy = malloc(len + 1);
    if (!copy)
        return -1;
    if (len > 0)
        memcpy(copy, body, len);
    copy[len] = '\0';
    m[0].rm_so = 0;
    m[0].rm_eo = (regoff_t)len;
    int matched = regexec(&h->re, copy, 2, m, REG_STARTEND) == 0;
    /* Group 1 does not take part when it sits in an alternative that did not match. */
    if (!matched || m[1].rm_so < 0 || m[1].rm_eo < m[1].rm_so ||
        scale_decimal(copy + m[1].rm_so, copy + m[1].rm_eo, 1, h->unit_ms, &ms) != 0)
        ms = -1;
    free(copy);
    return ms;
}

long long bo_full_jitter_ms(int attempt, long long base_ms, long long cap_ms, double rand01,
                            long long hint_ms)
{
    if (attempt < 0)
        attempt = 0;
    if (base_ms < 0)
        base_ms = 0;
    if (cap_ms < 0)
        cap_ms = 0;

    /* base * 2^attempt <= cap exactly when base <= floor(cap / 2^attempt), which needs no
     * multiplication that could overflow; past attempt 62 any positive base exceeds every cap,
     * since 2^63 is above LLONG_MAX. */
    long long ceiling;
    if (base_ms == 0)
        ceiling = 0;
    else if (attempt <= 62 && base_ms <= (cap_ms >> attempt))
        ceiling = base_ms * (1LL << attempt);
    else
        ceiling = cap_ms;

    long long delay = 0;
    /* NaN compares false with everything, so it gives 0 like a negative rand01. */
    if (ceiling > 0 && rand01 > 0) {
        double d = rand01 * (double)ceiling;
        /* (double)ceiling may round up to 2^63, so the product is compared as a double before
         * it is converted: a conversion out of range would be undefined. Truncation is floor
         * for a non-negative value. */
        if (rand01 >= 1.0 || d >= (double)ceiling)
            delay = ceiling - 1;
        else
            delay = (long long)d;
        if (delay >= ceiling)
            delay = ceiling - 1;
    }
    return hint_ms > delay ? hint_ms : delay;
}

int bo_budget_allows(int attempts_made, int max_attempts, long long elapsed_ms,
                     long long deadline_ms, long long delay_ms)
{
    if (attempts_made >= max_attempts)
        return 0;
    if (elapsed_ms < 0)
        elapsed_ms = 0;
    if (delay_ms < 0)
        delay_ms = 0;
    /* Subtracting instead of adding keeps the comparison exact for any values: with both
     * non-negative and elapsed <= deadline, deadline - elapsed cannot overflow. */
    if (deadline_ms < 0 || elapsed_ms > deadline_ms)
        return 0;
    return delay_ms <= deadline_ms - elapsed_ms;
}

double bo_result_write_window_s(double lease_remaining_s, double reap_grace_s)
{
    /* (a lease is at most an hour: config.c bounds lease_seconds) */
    if (!(lease_remaining_s > 0))
        lease_remaining_s = 0;
    else if (lease_remaining_s > 3600)
        lease_remaining_s = 3600;
    if (!(reap_grace_s > 0) || reap_grace_s > 3600)
        reap_grace_s = 0;
    double w = lease_remaining_s + reap_grace_s + BO_RESULT_WRITE_MARGIN_S;
    return w > BO_RESULT_WRITE_MIN_S ? w : BO_RESULT_WRITE_MIN_S;
}

int bo_result_write_gives_up(int past_window, int past_outage, int unreachable, int stopping)
{
    return past_window && (!unreachable || stopping || past_outage);
}
