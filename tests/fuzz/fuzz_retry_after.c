/* libFuzzer harness: the provider's delay hints (src/backoff.c): Retry-After (delay-seconds and
 * the three HTTP-date forms), retry-after-ms, and a delay in the words of an error body.
 *
 * The input is one header value (up to its first NUL), also read as a body. Properties checked:
 * - every parser answers -1 or a delay in 0..BO_DELAY_MAX_MS, for any clock;
 * - validity does not depend on the clock (but for an RFC 850 two-digit year), nor does
 *   delay-seconds' answer; a date's delay shrinks by
 *   exactly the time that passes (clamped at 0);
 * - a date read against now = 0 gives its Unix time; written back as an IMF-fixdate it reads the
 *   same (the three forms name one instant). */
#include "fuzz.h"

#include "idemgate/backoff.h"

#include <time.h>

static struct bo_body_hint hint_s, hint_ms;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (bo_body_hint_compile(&hint_s, "try again in ([0-9]+(\\.[0-9]+)?)s", 1000, 1) != 0 ||
        bo_body_hint_compile(&hint_ms, "retry after ([0-9]+(\\.[0-9]+)?) ?ms", 1, 0) != 0)
        abort();
    return 0;
}

static int in_range(long long v)
{
    return v == -1 || (v >= 0 && v <= BO_DELAY_MAX_MS);
}

/* Formats Unix time t as an IMF-fixdate into buf; 0, or -1 outside years 0000..9999. */
static int imf_fixdate(long long t, char *buf, size_t len)
{
    static const char *const days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                         "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t tt = (time_t)t;
    struct tm tm;
    if (!gmtime_r(&tt, &tm) || tm.tm_year + 1900 < 0 || tm.tm_year + 1900 > 9999)
        return -1;
    snprintf(buf, len, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday], tm.tm_mday,
             months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, '\0', size);
    size_t len = nul ? (size_t)(nul - data) : size;
    char *value = fz_strndup(data, len);
    static const long long nows[] = {0, 1796083200LL /* 2026-12-01 */, 253402300799LL,
                                     -62167219200LL, 9223372036854775807LL};

    long long at0 = bo_retry_after_ms(value, 0);
    FZ_CHECK(in_range(at0), "Retry-After in range (now 0)");
    for (size_t i = 0; i < sizeof(nows) / sizeof(nows[0]); i++) {
        long long d = bo_retry_after_ms(value, nows[i]);
        FZ_CHECK(in_range(d), "Retry-After in range");
        /* Only an RFC 850 date (the one form with '-') has a year that depends on the clock,
         * and with it whether 29 Feb exists. */
        if (!strchr(value, '-'))
            FZ_CHECK((d == -1) == (at0 == -1), "the clock does not decide what is valid");
    }
    const char *p = value;
    while (*p == ' ' || *p == '\t')
        p++;
    int is_date = at0 >= 0 && !(*p >= '0' && *p <= '9');
    if (at0 >= 0 && !is_date) {
        FZ_CHECK(bo_retry_after_ms(value, 1796083200LL) == at0, "delay-seconds ignore the clock");
    } else if (is_date && at0 < BO_DELAY_MAX_MS) {
        /* The date is within years 0000..9999, so its Unix time is at0 / 1000 when it is after
         * the epoch; one day later the delay is 86,400 s shorter (or 0). */
        long long t = at0 / 1000;
        FZ_CHECK(at0 % 1000 == 0, "a date's delay is whole seconds");
        long long later = bo_retry_after_ms(value, 86400);
        FZ_CHECK(later == (t > 86400 ? (t - 86400) * 1000 : 0), "a date's delay shrinks");
        if (t > 0) {
            char buf[64];
            FZ_CHECK(imf_fixdate(t, buf, sizeof(buf)) == 0, "the date has a four-digit year");
            FZ_CHECK(bo_retry_after_ms(buf, 0) == at0, "the IMF-fixdate of the date reads back");
        }
    }

    long long ms = bo_retry_after_ms_header(value);
    FZ_CHECK(in_range(ms), "retry-after-ms in range");
    FZ_CHECK(in_range(bo_body_hint_ms(&hint_s, (const char *)data, size)), "body hint (s)");
    FZ_CHECK(in_range(bo_body_hint_ms(&hint_ms, (const char *)data, size)), "body hint (ms)");
    free(value);
    return 0;
}
