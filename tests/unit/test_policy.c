/* What follows one attempt: the policy table (outcome × budget × hint). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "idemgate/policy.h"
#include "idemgate/profile.h"

struct row {
    struct pol_input in;
    enum op_state next;
    long long min_delay, max_delay;
    int trip;
};

/* attempts, max, elapsed, deadline, hint, base, cap, rand01 */
#define IN(o, att, max, el, dl, hint, r) {(o), (att), (max), (el), (dl), (hint), 100, 1000, (r), 0, 0, 0, 0, 500, 60000, 0, 0, 0, 0, 0, 0}
/* The same after an earlier ambiguous attempt. */
#define AMB(o, att, max, el, dl, hint, r) {(o), (att), (max), (el), (dl), (hint), 100, 1000, (r), 1, 0, 0, 0, 500, 60000, 0, 0, 0, 0, 0, 0}
/* This attempt may have made the task (a 5xx or a 409 under a native key): still a safe resend,
 * but never failed afterwards. */
#define MAY(o, att, max, el, dl, hint, r) {(o), (att), (max), (el), (dl), (hint), 100, 1000, (r), 0, 1, 0, 0, 500, 60000, 0, 0, 0, 0, 0, 0}
/* The reconciler's resend of an unknown create under the provider's key (idempotent_resubmit). */
#define RESEND(o, att, max, el, dl, hint, r) {(o), (att), (max), (el), (dl), (hint), 100, 1000, (r), 1, 0, 0, 0, 500, 60000, 0, 0, 0, 0, 1, 0}
/* An async provider's answer: outcome, truncated, task id read, status listed (poll every 2 s). */
#define ASYNC(o, trunc, id, listed) {(o), 1, 5, 0, 60000, -1, 100, 1000, 0.5, 0, 0, (trunc), 0, 500, 60000, 1, (id), (listed), 2000, 0, 0}

static const struct row rows[] = {
    {IN(CLS_SUCCESS, 1, 5, 0, 60000, -1, 0.5), ST_COMPLETED, 0, 0, 0},
    {IN(CLS_PARTIAL, 1, 5, 0, 60000, -1, 0.5), ST_COMPLETED, 0, 0, 0},
    {IN(CLS_REJECTED_REQUEST, 1, 5, 0, 60000, -1, 0.5), ST_FAILED, 0, 0, 0},
    {IN(CLS_REJECTED_ACCOUNT, 1, 5, 0, 60000, -1, 0.5), ST_FAILED, 0, 0, 1},
    /* A 402/403 with no marker of the credential: this job fails, nothing trips (issue 21). */
    {IN(CLS_REJECTED_UNMARKED, 1, 5, 0, 60000, -1, 0.5), ST_FAILED, 0, 0, 0},
    {AMB(CLS_REJECTED_UNMARKED, 2, 5, 0, 60000, -1, 0.5), ST_UNKNOWN, 500, 500, 0},
    /* Ambiguous never resends by itself, whatever the budget. */
    {IN(CLS_AMBIGUOUS, 1, 5, 0, 60000, -1, 0.5), ST_UNKNOWN, 0, 0, 0},
    {IN(CLS_AMBIGUOUS, 5, 5, 0, 60000, -1, 0.5), ST_UNKNOWN, 0, 0, 0},
    /* Not sent / back off: full jitter under base * 2^(attempt-1), capped. */
    {IN(CLS_NOT_SENT, 1, 5, 0, 60000, -1, 0.0), ST_PREPARED, 0, 0, 0},
    {IN(CLS_NOT_SENT, 1, 5, 0, 60000, -1, 0.99), ST_PREPARED, 0, 99, 0},
    {IN(CLS_BACKOFF, 3, 5, 0, 60000, -1, 0.99), ST_PREPARED, 300, 399, 0},
    {IN(CLS_BACKOFF, 4, 50, 0, 60000, -1, 0.99), ST_PREPARED, 790, 799, 0},
    {IN(CLS_BACKOFF, 20, 50, 0, 60000, -1, 0.99), ST_PREPARED, 989, 999, 0},
    /* Never earlier than the server's hint, even above the cap. */
    {IN(CLS_BACKOFF, 1, 5, 0, 60000, 2000, 0.5), ST_PREPARED, 2000, 2000, 0},
    {IN(CLS_BACKOFF, 1, 5, 0, 60000, 5000, 0.99), ST_PREPARED, 5000, 5000, 0},
    /* Budgets: the attempt limit, and a deadline the next delay would cross. */
    {IN(CLS_BACKOFF, 5, 5, 0, 60000, -1, 0.5), ST_FAILED, 0, 0, 0},
    {IN(CLS_NOT_SENT, 5, 5, 0, 60000, -1, 0.5), ST_FAILED, 0, 0, 0},
    {IN(CLS_BACKOFF, 1, 5, 59000, 60000, 2000, 0.5), ST_FAILED, 0, 0, 0},
    {IN(CLS_BACKOFF, 1, 5, 58000, 60000, 2000, 0.5), ST_PREPARED, 2000, 2000, 0},
    /* Once an attempt was ambiguous, nothing ends failed: the task may exist. */
    {AMB(CLS_BACKOFF, 5, 5, 0, 60000, -1, 0.5), ST_UNKNOWN, 500, 500, 0},
    {AMB(CLS_NOT_SENT, 5, 5, 0, 60000, -1, 0.5), ST_UNKNOWN, 500, 500, 0},
    {AMB(CLS_REJECTED_REQUEST, 2, 5, 0, 60000, -1, 0.5), ST_UNKNOWN, 500, 500, 0},
    {AMB(CLS_REJECTED_ACCOUNT, 2, 5, 0, 60000, -1, 0.5), ST_UNKNOWN, 500, 500, 1},
    {AMB(CLS_BACKOFF, 2, 5, 0, 60000, -1, 0.5), ST_PREPARED, 0, 199, 0},
    {AMB(CLS_SUCCESS, 2, 5, 0, 60000, -1, 0.5), ST_COMPLETED, 0, 0, 0},
    /* A whole answer only: a truncated 2xx is not a result. */
    {{CLS_SUCCESS, 1, 5, 0, 60000, -1, 100, 1000, 0.5, 0, 0, 1, 0, 500, 60000, 0, 0, 0, 0, 0, 0}, ST_UNKNOWN, 500, 500, 0},
    /* No way to look: the first (and only) look is at the end of the recovery window. */
    {{CLS_AMBIGUOUS, 1, 5, 15000, 60000, -1, 100, 1000, 0.5, 0, 0, 0, 1, 500, 60000, 0, 0, 0, 0, 0, 0}, ST_UNKNOWN, 45000, 45000, 0},
    /* A resend of an unknown create that the provider asks to make later stays unknown: the
     * reconciler resends it inside its window (as `prepared` a dispatcher sent it at any time,
     * perhaps after the provider forgot the key). No earlier than the server asked. */
    {RESEND(CLS_BACKOFF, 2, 5, 0, 60000, -1, 0.0), ST_UNKNOWN, 500, 500, 0},
    {RESEND(CLS_BACKOFF, 2, 5, 0, 60000, 5000, 0.5), ST_UNKNOWN, 5000, 5000, 0},
    {RESEND(CLS_NOT_SENT, 2, 5, 0, 60000, -1, 0.0), ST_UNKNOWN, 500, 500, 0},
    {RESEND(CLS_BACKOFF, 5, 5, 0, 60000, -1, 0.5), ST_UNKNOWN, 500, 500, 0},
    {RESEND(CLS_SUCCESS, 2, 5, 0, 60000, -1, 0.5), ST_COMPLETED, 0, 0, 0},
    {RESEND(CLS_AMBIGUOUS, 2, 5, 0, 60000, -1, 0.5), ST_UNKNOWN, 0, 0, 0},
    {MAY(CLS_BACKOFF, 1, 5, 0, 60000, -1, 0.0), ST_PREPARED, 0, 0, 0},
    {MAY(CLS_BACKOFF, 5, 5, 0, 60000, -1, 0.5), ST_UNKNOWN, 500, 500, 0},
    /* An async provider: a whole 2xx with a task id is accepted and polled; without one nobody
     * knows which task was paid for (unknown); a truncated one is no answer at all. */
    {ASYNC(CLS_SUCCESS, 0, 1, 1), ST_ACCEPTED, 2000, 2000, 0},
    {ASYNC(CLS_PARTIAL, 0, 1, 1), ST_ACCEPTED, 2000, 2000, 0},
    {ASYNC(CLS_SUCCESS, 0, 0, 1), ST_UNKNOWN, 0, 0, 0},
    {ASYNC(CLS_SUCCESS, 0, 0, 0), ST_UNKNOWN, 0, 0, 0},
    {ASYNC(CLS_SUCCESS, 1, 1, 1), ST_UNKNOWN, 500, 500, 0},
    {ASYNC(CLS_REJECTED_REQUEST, 0, 0, 1), ST_FAILED, 0, 0, 0},
    /* A synchronous 2xx that is not the provider's JSON (an egress proxy's page): its task may
     * exist, and this is not its result. */
    {{.outcome = CLS_SUCCESS, .attempts_made = 1, .max_attempts = 5, .deadline_ms = 60000,
      .hint_ms = -1, .base_ms = 100, .cap_ms = 1000, .rand01 = 0.5,
      .reconcile_interval_ms = 500, .recovery_window_ms = 60000, .unreadable = 1},
     ST_UNKNOWN, 500, 500, 0},
    {{.outcome = CLS_PARTIAL, .attempts_made = 1, .max_attempts = 5, .deadline_ms = 60000,
      .hint_ms = -1, .base_ms = 100, .cap_ms = 1000, .rand01 = 0.5,
      .reconcile_interval_ms = 500, .recovery_window_ms = 60000, .unreadable = 1},
     ST_UNKNOWN, 500, 500, 0},
};

static void test_rows(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        struct pol_decision d = pol_decide(&rows[i].in);
        if (d.next != rows[i].next)
            fail_msg("row %zu: state %s, want %s", i, st_name(d.next), st_name(rows[i].next));
        if ((d.next == ST_PREPARED || d.next == ST_ACCEPTED ||
             (d.next == ST_UNKNOWN && rows[i].max_delay) ||
             (d.next == ST_UNKNOWN && rows[i].in.async && !rows[i].in.truncated)) &&
            (d.delay_ms < rows[i].min_delay || d.delay_ms > rows[i].max_delay))
            fail_msg("row %zu: delay %lld outside [%lld, %lld]", i, d.delay_ms,
                     rows[i].min_delay, rows[i].max_delay);
        assert_int_equal(d.trip_credential, rows[i].trip);
        if (d.next != ST_COMPLETED && d.next != ST_ACCEPTED)
            assert_non_null(d.reason);
        assert_int_equal(d.ambiguous, d.next == ST_UNKNOWN || rows[i].in.may_have_created);
    }
}

/* The server's hint and the random draw are gathered only for the outcomes that read them
 * (attempt.c skips the headers' parse, the body's regex and the CSPRNG otherwise): for every
 * other row of the table, any hint and any draw decide exactly the same; for the ones that read
 * them, some hint or draw changes the delay. */
static void test_wait_inputs_read_only_where_needed(void **state)
{
    (void)state;
    static const long long hints[] = {-1, 0, 2000, 86400000};
    static const double draws[] = {0.0, 0.5, 0.999};
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        struct pol_input in = rows[i].in;
        struct pol_decision first = pol_decide(&in);
        int differs = 0;
        for (size_t h = 0; h < sizeof(hints) / sizeof(hints[0]); h++)
            for (size_t r = 0; r < sizeof(draws) / sizeof(draws[0]); r++) {
                in.hint_ms = hints[h];
                in.rand01 = draws[r];
                struct pol_decision d = pol_decide(&in);
                differs |= d.next != first.next || d.delay_ms != first.delay_ms ||
                           d.trip_credential != first.trip_credential ||
                           d.ambiguous != first.ambiguous || d.reason != first.reason;
            }
        if (differs && !pol_needs_wait_inputs(in.outcome))
            fail_msg("row %zu: the hint or the draw changed a decision said not to read them", i);
    }
    /* And the outcomes that read them do: a back-off waits at least the hint. */
    struct pol_input b = rows[0].in;
    b.outcome = CLS_BACKOFF;
    b.hint_ms = -1;
    b.rand01 = 0.0;
    long long plain = pol_decide(&b).delay_ms;
    b.hint_ms = 3000;
    assert_true(pol_needs_wait_inputs(CLS_BACKOFF) && pol_needs_wait_inputs(CLS_NOT_SENT));
    assert_true(pol_decide(&b).delay_ms != plain);
}

/* A create that can never be sent as recorded ends failed, unless its task may already exist. */
/* Under a native key, a create that may have made its task is sent again only inside its
 * recovery window; an operator's `absent` and a keyless provider's proven absence are not held. */
static void test_send_in_window(void **state)
{
    (void)state;
    static const struct {
        int ambiguous, keyed, absent;
        long long since_first_ms;
        long window_ms;
        int want;
    } win[] = {
        {0, 1, 0, 0, 3600000, 1},       {0, 1, 0, 99999999, 3600000, 1}, /* nothing ambiguous */
        {1, 1, 0, 0, 3600000, 1},       {1, 1, 0, 3599999, 3600000, 1},  /* inside the window */
        {1, 1, 0, 3600000, 3600000, 0}, {1, 1, 0, 86400000, 3600000, 0}, /* at its end, after */
        {1, 1, 0, 1, 0, 0},
        {1, 1, 1, 86400000, 3600000, 1}, /* an operator's absent: sent on that word */
        {1, 0, 0, 86400000, 3600000, 1}, /* keyless: a proven absence, no key to forget */
    };
    for (size_t i = 0; i < sizeof(win) / sizeof(win[0]); i++)
        if (pol_send_in_window(win[i].ambiguous, win[i].keyed, win[i].absent,
                               win[i].since_first_ms, win[i].window_ms) != win[i].want)
            fail_msg("row %zu", i);
}

static void test_unsendable(void **state)
{
    (void)state;
    assert_int_equal(pol_unsendable(0), ST_FAILED);
    assert_int_equal(pol_unsendable(1), ST_UNKNOWN);
}

/* A cancel is marked sent only when its answer will not change: sent again otherwise. */
static void test_cancel_answered(void **state)
{
    (void)state;
    static const struct {
        int curl, status, want;
    } cases[] = {
        {0, 200, 1}, {0, 201, 1}, {0, 202, 1}, {0, 204, 1}, /* cancelled, or cancelling */
        {0, 400, 1}, {0, 410, 1}, {0, 422, 1},              /* ended, not cancellable */
        {0, 401, 0}, {0, 403, 0}, {0, 404, 0},              /* a key rotated; not visible yet */
        {0, 408, 0}, {0, 409, 0}, {0, 425, 0}, {0, 429, 0}, /* later */
        {0, 500, 0}, {0, 502, 0}, {0, 503, 0}, {0, 302, 0}, {0, 0, 0},
        {28, 0, 0},  {7, 0, 0},   {56, 200, 0},             /* transport errors */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (pol_cancel_answered(cases[i].curl, cases[i].status) != cases[i].want)
            fail_msg("case %zu: curl %d, HTTP %d", i, cases[i].curl, cases[i].status);
}

/* A due cancel goes only to a task the read just before it shows still running. */
static void test_cancel_after_read(void **state)
{
    (void)state;
    static const struct {
        int st, want;
    } cases[] = {
        {TS_QUEUED, 1}, {TS_RUNNING, 1},                      /* still running: cancelled */
        {TS_SUCCEEDED, 0}, {TS_FAILED, 0}, {TS_CANCELED, 0}, /* ended: concluded as it ended */
        {-1, 0},                                              /* unreadable: read again next */
        {TS__COUNT, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (pol_cancel_after_read(cases[i].st) != cases[i].want)
            fail_msg("case %zu: status %d", i, cases[i].st);
}

/* A cancel that deletes leaves only while the read that showed the task running is fresh: a
 * poller held up between the two deleted a task that finished meanwhile. */
static void test_cancel_by(void **state)
{
    (void)state;
    static const struct {
        int deletes;
        double lease_by, read_at, want;
    } cases[] = {
        {0, 100.0, 10.0, 100.0},                          /* a plain cancel: the lease's */
        {1, 100.0, 10.0, 10.0 + POL_CANCEL_READ_FRESH_S}, /* deleting: the read's */
        {1, 11.0, 10.0, 11.0},                            /* the lease ends first */
        {1, 100.0, 99.0, 100.0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        double got = pol_cancel_by(cases[i].deletes, cases[i].lease_by, cases[i].read_at);
        if (got != cases[i].want)
            fail_msg("row %zu: %g, want %g", i, got, cases[i].want);
    }
}

/* A 404 just after an accepted cancel, at a provider whose cancel deletes the task: cancelled. */
static void test_deleted_by_cancel(void **state)
{
    (void)state;
    static const struct {
        int deletes, cancel, curl, read, want;
    } cases[] = {
        {1, 200, 0, 404, 1}, {1, 204, 0, 410, 1},         /* deleted by our cancel */
        {0, 200, 0, 404, 0},                                /* a cancel that does not delete */
        {1, 0, 0, 404, 0},   {1, 503, 0, 404, 0},          /* no cancel accepted: not ours */
        {1, 404, 0, 404, 0},                                /* the cancel itself found nothing */
        {1, 200, 0, 200, 0}, {1, 200, 0, 500, 0}, {1, 200, 28, 0, 0}, /* read, or not read */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (pol_deleted_by_cancel(cases[i].deletes, cases[i].cancel, cases[i].curl,
                                  cases[i].read) != cases[i].want)
            fail_msg("case %zu", i);
}

/* The next status read: the interval grown, capped, never under a hint or what the answer asked. */
static void test_poll_delay(void **state)
{
    (void)state;
    static const struct {
        long interval, max;
        int polls;
        long hint;
        long long server;
        long want;
    } cases[] = {
        {1000, 10000, 1, -1, -1, 1000},   {1000, 10000, 2, -1, -1, 1500},
        {1000, 10000, 3, -1, -1, 2250},   {1000, 10000, 50, -1, -1, 10000}, /* capped */
        {1000, 10000, 1, 5000, -1, 5000}, /* the provider's poll hint */
        {1000, 10000, 1, -1, 30000, 30000}, /* a 429's Retry-After: 30 s, past the cap */
        {1000, 10000, 50, -1, 2000, 10000}, /* a hint under the delay changes nothing */
        {1000, 10000, 1, -1, 86400000LL, 3600000}, /* a day asked: an hour at most */
        {1000, 10000, 1, 86400000L, -1, 3600000},  /* the hint header too */
        {1000, 10000, 1, 3599999L, -1, 3599999},
        {1000, 10000, 1, 500, 0, 1000},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (pol_poll_delay_ms(cases[i].interval, cases[i].max, cases[i].polls, cases[i].hint,
                              cases[i].server) != cases[i].want)
            fail_msg("case %zu", i);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rows),
                                       cmocka_unit_test(test_wait_inputs_read_only_where_needed),
                                       cmocka_unit_test(test_unsendable),
                                       cmocka_unit_test(test_send_in_window),
                                       cmocka_unit_test(test_cancel_answered),
                                       cmocka_unit_test(test_cancel_after_read),
                                       cmocka_unit_test(test_deleted_by_cancel),
                                       cmocka_unit_test(test_cancel_by),
                                       cmocka_unit_test(test_poll_delay)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
