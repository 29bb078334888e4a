/* The outcome classifier, one row per case of libcurl evidence (STYLE.md) and HTTP status. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "idemgate/classify.h"

/* libcurl codes, spelled out so the table reads like the evidence. */
enum {
    OK = 0,
    COULDNT_RESOLVE_HOST = 6,
    COULDNT_CONNECT = 7,
    PARTIAL_FILE = 18,
    ABORTED_BY_CALLBACK = 42,
    OPERATION_TIMEDOUT = 28,
    SSL_CONNECT_ERROR = 35,
    GOT_NOTHING = 52,
    SEND_ERROR = 55,
    RECV_ERROR = 56,
};

static const int NOT_CREATED_DEFAULT[] = {408, 425, 429};
static const int NOT_CREATED_503[] = {408, 425, 429, 503};
static const int TRIP_DEFAULT[] = {401, 402, 403};
static const int TRIP_401[] = {401};

struct row {
    struct cls_evidence ev;
    enum cls_outcome want;
};

static const struct row rows[] = {
    /* Nothing left this host. */
    {{COULDNT_RESOLVE_HOST, 0, 0, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_NOT_SENT},
    {{COULDNT_CONNECT, 0, 0, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_NOT_SENT},
    {{OPERATION_TIMEDOUT, 0, 0, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_NOT_SENT}, /* connect timeout */
    {{SSL_CONNECT_ERROR, 0, 0, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_NOT_SENT},
    {{ABORTED_BY_CALLBACK, 0, 0, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_NOT_SENT}, /* PREREQFUNCTION refused */
    /* Sent, no answer: hang past the timeout, close, reset. */
    {{OPERATION_TIMEDOUT, 300, 0, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    {{GOT_NOTHING, 300, 0, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    {{RECV_ERROR, 300, 0, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    {{SEND_ERROR, 120, 0, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    /* A response started, then broke: the status line decides when it refuses. */
    {{PARTIAL_FILE, 300, 150, 200, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    {{OPERATION_TIMEDOUT, 300, 150, 201, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    {{PARTIAL_FILE, 300, 150, 400, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_REJECTED_REQUEST},
    {{RECV_ERROR, 300, 150, 401, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_REJECTED_ACCOUNT},
    {{PARTIAL_FILE, 300, 150, 503, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    {{PARTIAL_FILE, 300, 150, 429, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_BACKOFF},
    /* Complete answers. */
    {{OK, 300, 150, 200, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_SUCCESS},
    {{OK, 300, 150, 201, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_SUCCESS},
    {{OK, 300, 150, 200, 1, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_PARTIAL},
    {{OK, 300, 150, 400, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_REJECTED_REQUEST},
    {{OK, 300, 150, 404, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_REJECTED_REQUEST},
    {{OK, 300, 150, 409, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_REJECTED_REQUEST},
    {{OK, 300, 150, 422, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_REJECTED_REQUEST},
    {{OK, 300, 150, 401, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_REJECTED_ACCOUNT},
    /* 402/403 without a declared marker are about the request as far as anyone knows. */
    {{OK, 300, 150, 402, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_REJECTED_UNMARKED},
    {{OK, 300, 150, 403, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_REJECTED_UNMARKED},
    {{OK, 300, 150, 408, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_BACKOFF},
    {{OK, 300, 150, 425, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_BACKOFF},
    {{OK, 300, 150, 429, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_BACKOFF},
    /* A 5xx may come from a CDN after the origin accepted the work: without a native key
     * nobody knows (unless the profile declares the status "not created", below). */
    {{OK, 300, 150, 500, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    {{OK, 300, 150, 502, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    {{OK, 300, 150, 503, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    {{OK, 300, 150, 504, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    {{OK, 300, 150, 520, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    {{OK, 300, 150, 524, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    {{OK, 300, 150, 503, 0, 0, NOT_CREATED_503, 4, TRIP_DEFAULT, 3, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_BACKOFF},
    {{OK, 300, 150, 502, 0, 0, NOT_CREATED_503, 4, TRIP_DEFAULT, 3, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    /* Under a native key every status is a safe resend under the same key. */
    {{OK, 300, 150, 500, 0, 1, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_BACKOFF},
    {{OK, 300, 150, 502, 0, 1, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_BACKOFF},
    {{OK, 300, 150, 503, 0, 1, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_BACKOFF},
    /* Which statuses trip the credential is the profile's to say. */
    {{OK, 300, 150, 403, 0, 0, NOT_CREATED_DEFAULT, 3, TRIP_401, 1, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_REJECTED_REQUEST},
    {{OK, 300, 150, 401, 0, 0, NOT_CREATED_DEFAULT, 3, TRIP_401, 1, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_REJECTED_ACCOUNT},
    /* Under a provider idempotency key, 409 says the first request is still in flight. */
    {{OK, 300, 150, 409, 0, 1, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_BACKOFF},
    {{OK, 300, 150, 400, 0, 1, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_REJECTED_REQUEST},
    {{OK, 300, 150, 200, 0, 1, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_SUCCESS},
    /* A redirect to a create is not followed; nobody can say a task exists or not. */
    {{OK, 300, 150, 302, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    {{OK, 300, 0, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, CLS_AMBIGUOUS},
    /* libcurl's own re-send after a kept-alive connection died before any answer, refused
     * (upstream.h): the dead connection's bytes decide. None left: a clean resend later. Some
     * left: the provider may have read them — even under a native key, whose 409 or replay
     * only the reconciler's resubmission may see. */
    {{.curl_code = ABORTED_BY_CALLBACK, .resend_refused = 1}, CLS_NOT_SENT},
    {{.curl_code = ABORTED_BY_CALLBACK, .bytes_sent = 300, .resend_refused = 1}, CLS_AMBIGUOUS},
    {{.curl_code = ABORTED_BY_CALLBACK, .bytes_sent = 300, .idempotent = 1, .resend_refused = 1},
     CLS_AMBIGUOUS},
};

/* Issue 21 §5: one tenant's refused request must not stop a provider for every tenant. A trip
 * status trips only on evidence about the credential: 401, or a body with a declared marker. */
static const char *const MARKERS[] = {"insufficient_quota", "account_deactivated"};
#define BODY(s) (s), sizeof(s) - 1
static const struct row marker_rows[] = {
    {{OK, 300, 150, 401, 0, 0, NULL, 0, NULL, 0, NULL, 0, MARKERS, 2, 0, 0, 0, 0}, CLS_REJECTED_ACCOUNT},
    {{OK, 300, 150, 401, 0, 0, NULL, 0, NULL, 0, BODY("{\"error\":\"bad key\"}"), MARKERS, 2, 0, 0, 0, 0},
     CLS_REJECTED_ACCOUNT},
    {{OK, 300, 150, 403, 0, 0, NULL, 0, NULL, 0, BODY("{\"code\":\"model_not_allowed\"}"),
      MARKERS, 2, 0, 0, 0, 0},
     CLS_REJECTED_UNMARKED},
    {{OK, 300, 150, 403, 0, 0, NULL, 0, NULL, 0, BODY("{\"code\":\"content_policy\"}"), NULL, 0, 0, 0, 0, 0},
     CLS_REJECTED_UNMARKED},
    {{OK, 300, 150, 403, 0, 0, NULL, 0, NULL, 0, BODY("{\"code\":\"account_deactivated\"}"),
      MARKERS, 2, 0, 0, 0, 0},
     CLS_REJECTED_ACCOUNT},
    {{OK, 300, 150, 402, 0, 0, NULL, 0, NULL, 0, BODY("insufficient_quota"), MARKERS, 2, 0, 0, 0, 0},
     CLS_REJECTED_ACCOUNT},
    /* Byte-exact: another case, or a marker cut by the body's end, is no marker. */
    {{OK, 300, 150, 402, 0, 0, NULL, 0, NULL, 0, BODY("INSUFFICIENT_QUOTA"), MARKERS, 2, 0, 0, 0, 0},
     CLS_REJECTED_UNMARKED},
    {{OK, 300, 150, 402, 0, 0, NULL, 0, NULL, 0, BODY("insufficient_quot"), MARKERS, 2, 0, 0, 0, 0},
     CLS_REJECTED_UNMARKED},
    {{OK, 300, 150, 402, 0, 0, NULL, 0, NULL, 0, NULL, 0, MARKERS, 2, 0, 0, 0, 0}, CLS_REJECTED_UNMARKED},
    /* A broken answer: its status line and the bytes that came decide. */
    {{PARTIAL_FILE, 300, 150, 403, 0, 0, NULL, 0, NULL, 0, BODY("{\"e\":\"insufficient_quota"),
      MARKERS, 2, 0, 0, 0, 0},
     CLS_REJECTED_ACCOUNT},
    {{PARTIAL_FILE, 300, 150, 403, 0, 0, NULL, 0, NULL, 0, BODY("{\"e\":"), MARKERS, 2, 0, 0, 0, 0},
     CLS_REJECTED_UNMARKED},
    /* A status the profile does not list never trips, marker or not. */
    {{OK, 300, 150, 403, 0, 0, NOT_CREATED_DEFAULT, 3, TRIP_401, 1, BODY("insufficient_quota"),
      MARKERS, 2, 0, 0, 0, 0},
     CLS_REJECTED_REQUEST},
    /* A marker in a 2xx or a 400 means nothing. */
    {{OK, 300, 150, 200, 0, 0, NULL, 0, NULL, 0, BODY("insufficient_quota"), MARKERS, 2, 0, 0, 0, 0},
     CLS_SUCCESS},
    {{OK, 300, 150, 400, 0, 0, NULL, 0, NULL, 0, BODY("insufficient_quota"), MARKERS, 2, 0, 0, 0, 0},
     CLS_REJECTED_REQUEST},
};

static void check_rows(const struct row *rs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct cls_evidence ev = rs[i].ev;
        if (!ev.not_created) { /* the profile defaults */
            ev.not_created = NOT_CREATED_DEFAULT;
            ev.n_not_created = 3;
            ev.trip = TRIP_DEFAULT;
            ev.n_trip = 3;
        }
        enum cls_outcome got = cls_classify(&ev);
        if (got != rs[i].want)
            fail_msg("row %zu: got %s, want %s", i, cls_name(got), cls_name(rs[i].want));
    }
}

static void test_403_without_marker_fails_only_that_job(void **state)
{
    (void)state;
    check_rows(marker_rows, sizeof(marker_rows) / sizeof(marker_rows[0]));
}

/* Before blocking everyone, the profile's probe: only a 2xx refutes the create's evidence. */
static void test_trip_is_confirmed_by_the_probe(void **state)
{
    (void)state;
    static const struct {
        int probe_status; /* -1: the profile has no probe; 0: no answer */
        enum cls_outcome o;
        enum cls_probe want_class;
        int trip;
    } cases[] = {
        {-1, CLS_REJECTED_ACCOUNT, CLS_PROBE_NONE, 1}, /* nothing can refute the evidence */
        {200, CLS_REJECTED_ACCOUNT, CLS_PROBE_OK, 0},  /* the credential works: the job only */
        {204, CLS_REJECTED_ACCOUNT, CLS_PROBE_OK, 0},
        {401, CLS_REJECTED_ACCOUNT, CLS_PROBE_REFUSED, 1},
        {403, CLS_REJECTED_ACCOUNT, CLS_PROBE_REFUSED, 1},
        {0, CLS_REJECTED_ACCOUNT, CLS_PROBE_NO_ANSWER, 1},   /* proves nothing */
        {503, CLS_REJECTED_ACCOUNT, CLS_PROBE_NO_ANSWER, 1},
        {404, CLS_REJECTED_ACCOUNT, CLS_PROBE_NO_ANSWER, 1},
        {-1, CLS_REJECTED_UNMARKED, CLS_PROBE_NONE, 0},      /* never about the credential */
        {401, CLS_REJECTED_UNMARKED, CLS_PROBE_REFUSED, 0},
        {-1, CLS_REJECTED_REQUEST, CLS_PROBE_NONE, 0},
        {-1, CLS_AMBIGUOUS, CLS_PROBE_NONE, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        enum cls_probe pc = cases[i].probe_status < 0
                                ? CLS_PROBE_NONE
                                : cls_probe_class(cases[i].probe_status, TRIP_DEFAULT, 3);
        if (pc != cases[i].want_class || cls_trip_confirmed(cases[i].o, pc) != cases[i].trip)
            fail_msg("case %zu: probe class %d, trip %d", i, pc, cls_trip_confirmed(cases[i].o, pc));
    }
}

static void test_rows(void **state)
{
    (void)state;
    check_rows(rows, sizeof(rows) / sizeof(rows[0]));
}

/* A 2xx event stream without its terminal event was generated and paid for: ambiguous, never a
 * success, whatever the transfer's own end; a status that is not 2xx is judged as ever. */
static void test_a_cut_stream_is_ambiguous(void **state)
{
    (void)state;
    static const struct {
        int curl_code, status, cut, whole;
        enum cls_outcome want;
    } cases[] = {
        {OK, 200, 1, 0, CLS_AMBIGUOUS},
        {OK, 200, 0, 1, CLS_SUCCESS},
        {PARTIAL_FILE, 200, 1, 0, CLS_AMBIGUOUS},
        {RECV_ERROR, 200, 1, 0, CLS_AMBIGUOUS},
        {OK, 429, 1, 0, CLS_BACKOFF},
        {OK, 400, 1, 0, CLS_REJECTED_REQUEST},
        /* read whole to its terminal event, then the transfer broke: the answer is whole */
        {PARTIAL_FILE, 200, 0, 1, CLS_SUCCESS},
        {RECV_ERROR, 200, 0, 1, CLS_SUCCESS},
        {OPERATION_TIMEDOUT, 200, 0, 1, CLS_SUCCESS},
        /* not read whole (no stream, or its end unknown): the transfer's end decides */
        {PARTIAL_FILE, 200, 0, 0, CLS_AMBIGUOUS},
        {OPERATION_TIMEDOUT, 200, 0, 0, CLS_AMBIGUOUS},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct cls_evidence ev = {.curl_code = cases[i].curl_code,
                                  .bytes_sent = 300,
                                  .header_bytes = 150,
                                  .http_status = cases[i].status,
                                  .not_created = NOT_CREATED_DEFAULT,
                                  .n_not_created = 3,
                                  .stream_cut = cases[i].cut,
                                  .stream_whole = cases[i].whole};
        enum cls_outcome o = cls_classify(&ev);
        if (o != cases[i].want)
            fail_msg("case %zu: %s", i, cls_name(o));
        assert_int_equal(cls_may_have_created(&ev, o), o == CLS_AMBIGUOUS);
    }
}

/* A 2xx stream whose error event came before any output is judged as the status it names would
 * be before the stream began (the profile's not-created list and trip statuses apply); an
 * error of no known status, or any transfer error, leaves it cut: ambiguous. */
static void test_an_error_event_before_output_is_its_status(void **state)
{
    (void)state;
    static const int not_created_anthropic[] = {408, 425, 429, 529};
    static const struct {
        int curl_code, error_status, idempotent;
        enum cls_outcome want;
        int may_have_created;
    } cases[] = {
        {OK, 529, 0, CLS_BACKOFF, 0},           /* overloaded: listed as not created */
        {OK, 429, 0, CLS_BACKOFF, 0},           /* rate limited */
        {OK, 400, 0, CLS_REJECTED_REQUEST, 0},  /* the request itself: fails, never resent */
        {OK, 500, 0, CLS_AMBIGUOUS, 1},         /* a 5xx: nobody knows */
        {OK, 500, 1, CLS_BACKOFF, 1},           /* ... unless under a native key */
        {OK, 401, 0, CLS_REJECTED_UNMARKED, 0}, /* never a trip from inside a stream */
        {OK, 402, 0, CLS_REJECTED_UNMARKED, 0},
        {OK, 403, 0, CLS_REJECTED_UNMARKED, 0}, /* one request's refusal */
        {OK, 0, 0, CLS_AMBIGUOUS, 1},           /* an error type not known here */
        {RECV_ERROR, 529, 0, CLS_AMBIGUOUS, 1}, /* the transfer broke too: proves nothing */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct cls_evidence ev = {.curl_code = cases[i].curl_code,
                                  .bytes_sent = 300,
                                  .header_bytes = 150,
                                  .http_status = 200,
                                  .idempotent = cases[i].idempotent,
                                  .not_created = not_created_anthropic,
                                  .n_not_created = 4,
                                  .trip = TRIP_DEFAULT,
                                  .n_trip = 3,
                                  .stream_cut = 1,
                                  .stream_error_status = cases[i].error_status};
        enum cls_outcome o = cls_classify(&ev);
        if (o != cases[i].want)
            fail_msg("case %zu: %s", i, cls_name(o));
        assert_int_equal(cls_may_have_created(&ev, o), cases[i].may_have_created);
    }
}

/* Which evidence leaves open that the attempt made a task. */
static void test_may_have_created(void **state)
{
    (void)state;
    static const struct {
        struct cls_evidence ev;
        int want;
    } cases[] = {
        {{OPERATION_TIMEDOUT, 300, 0, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, 1}, /* ambiguous */
        {{COULDNT_CONNECT, 0, 0, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, 0},      /* not sent */
        {{OK, 300, 150, 429, 0, 1, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, 0},             /* declared not created */
        {{OK, 300, 150, 503, 0, 1, NOT_CREATED_503, 4, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, 0},
        {{OK, 300, 150, 502, 0, 1, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, 1},             /* 5xx under a key */
        {{OK, 300, 150, 409, 0, 1, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, 1},             /* in flight: it exists */
        {{OK, 300, 150, 400, 0, 1, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, 0},
        {{OK, 300, 150, 200, 0, 0, NULL, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0}, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct cls_evidence ev = cases[i].ev;
        if (!ev.not_created) {
            ev.not_created = NOT_CREATED_DEFAULT;
            ev.n_not_created = 3;
        }
        ev.trip = TRIP_DEFAULT;
        ev.n_trip = 3;
        if (cls_may_have_created(&ev, cls_classify(&ev)) != cases[i].want)
            fail_msg("row %zu", i);
    }
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(cls_name(CLS_NOT_SENT), "not_sent");
    assert_string_equal(cls_name(CLS_AMBIGUOUS), "ambiguous");
    assert_string_equal(cls_name(CLS_REJECTED_UNMARKED), "rejected_unmarked");
    assert_string_equal(cls_name(CLS__COUNT), "invalid");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_a_cut_stream_is_ambiguous),
        cmocka_unit_test(test_an_error_event_before_output_is_its_status),
        cmocka_unit_test(test_403_without_marker_fails_only_that_job),
        cmocka_unit_test(test_trip_is_confirmed_by_the_probe),
        cmocka_unit_test(test_may_have_created),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
