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
    {{COULDNT_RESOLVE_HOST, 0, 0, 0, 0, 0, NULL, 0, NULL, 0}, CLS_NOT_SENT},
    {{COULDNT_CONNECT, 0, 0, 0, 0, 0, NULL, 0, NULL, 0}, CLS_NOT_SENT},
    {{OPERATION_TIMEDOUT, 0, 0, 0, 0, 0, NULL, 0, NULL, 0}, CLS_NOT_SENT}, /* connect timeout */
    {{SSL_CONNECT_ERROR, 0, 0, 0, 0, 0, NULL, 0, NULL, 0}, CLS_NOT_SENT},
    {{ABORTED_BY_CALLBACK, 0, 0, 0, 0, 0, NULL, 0, NULL, 0}, CLS_NOT_SENT}, /* PREREQFUNCTION refused */
    /* Sent, no answer: hang past the timeout, close, reset. */
    {{OPERATION_TIMEDOUT, 300, 0, 0, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
    {{GOT_NOTHING, 300, 0, 0, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
    {{RECV_ERROR, 300, 0, 0, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
    {{SEND_ERROR, 120, 0, 0, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
    /* A response started, then broke: the status line decides when it refuses. */
    {{PARTIAL_FILE, 300, 150, 200, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
    {{OPERATION_TIMEDOUT, 300, 150, 201, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
    {{PARTIAL_FILE, 300, 150, 400, 0, 0, NULL, 0, NULL, 0}, CLS_REJECTED_REQUEST},
    {{RECV_ERROR, 300, 150, 401, 0, 0, NULL, 0, NULL, 0}, CLS_REJECTED_ACCOUNT},
    {{PARTIAL_FILE, 300, 150, 503, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
    {{PARTIAL_FILE, 300, 150, 429, 0, 0, NULL, 0, NULL, 0}, CLS_BACKOFF},
    /* Complete answers. */
    {{OK, 300, 150, 200, 0, 0, NULL, 0, NULL, 0}, CLS_SUCCESS},
    {{OK, 300, 150, 201, 0, 0, NULL, 0, NULL, 0}, CLS_SUCCESS},
    {{OK, 300, 150, 200, 1, 0, NULL, 0, NULL, 0}, CLS_PARTIAL},
    {{OK, 300, 150, 400, 0, 0, NULL, 0, NULL, 0}, CLS_REJECTED_REQUEST},
    {{OK, 300, 150, 404, 0, 0, NULL, 0, NULL, 0}, CLS_REJECTED_REQUEST},
    {{OK, 300, 150, 409, 0, 0, NULL, 0, NULL, 0}, CLS_REJECTED_REQUEST},
    {{OK, 300, 150, 422, 0, 0, NULL, 0, NULL, 0}, CLS_REJECTED_REQUEST},
    {{OK, 300, 150, 401, 0, 0, NULL, 0, NULL, 0}, CLS_REJECTED_ACCOUNT},
    {{OK, 300, 150, 402, 0, 0, NULL, 0, NULL, 0}, CLS_REJECTED_ACCOUNT},
    {{OK, 300, 150, 403, 0, 0, NULL, 0, NULL, 0}, CLS_REJECTED_ACCOUNT},
    {{OK, 300, 150, 408, 0, 0, NULL, 0, NULL, 0}, CLS_BACKOFF},
    {{OK, 300, 150, 425, 0, 0, NULL, 0, NULL, 0}, CLS_BACKOFF},
    {{OK, 300, 150, 429, 0, 0, NULL, 0, NULL, 0}, CLS_BACKOFF},
    /* A 5xx may come from a CDN after the origin accepted the work: without a native key
     * nobody knows (unless the profile declares the status "not created", below). */
    {{OK, 300, 150, 500, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
    {{OK, 300, 150, 502, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
    {{OK, 300, 150, 503, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
    {{OK, 300, 150, 504, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
    {{OK, 300, 150, 520, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
    {{OK, 300, 150, 524, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
    {{OK, 300, 150, 503, 0, 0, NOT_CREATED_503, 4, TRIP_DEFAULT, 3}, CLS_BACKOFF},
    {{OK, 300, 150, 502, 0, 0, NOT_CREATED_503, 4, TRIP_DEFAULT, 3}, CLS_AMBIGUOUS},
    /* Under a native key every status is a safe resend under the same key. */
    {{OK, 300, 150, 500, 0, 1, NULL, 0, NULL, 0}, CLS_BACKOFF},
    {{OK, 300, 150, 502, 0, 1, NULL, 0, NULL, 0}, CLS_BACKOFF},
    {{OK, 300, 150, 503, 0, 1, NULL, 0, NULL, 0}, CLS_BACKOFF},
    /* Which statuses trip the credential is the profile's to say. */
    {{OK, 300, 150, 403, 0, 0, NOT_CREATED_DEFAULT, 3, TRIP_401, 1}, CLS_REJECTED_REQUEST},
    {{OK, 300, 150, 401, 0, 0, NOT_CREATED_DEFAULT, 3, TRIP_401, 1}, CLS_REJECTED_ACCOUNT},
    /* Under a provider idempotency key, 409 says the first request is still in flight. */
    {{OK, 300, 150, 409, 0, 1, NULL, 0, NULL, 0}, CLS_BACKOFF},
    {{OK, 300, 150, 400, 0, 1, NULL, 0, NULL, 0}, CLS_REJECTED_REQUEST},
    {{OK, 300, 150, 200, 0, 1, NULL, 0, NULL, 0}, CLS_SUCCESS},
    /* A redirect to a create is not followed; nobody can say a task exists or not. */
    {{OK, 300, 150, 302, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
    {{OK, 300, 0, 0, 0, 0, NULL, 0, NULL, 0}, CLS_AMBIGUOUS},
};

static void test_rows(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        struct cls_evidence ev = rows[i].ev;
        if (!ev.not_created) { /* the profile defaults */
            ev.not_created = NOT_CREATED_DEFAULT;
            ev.n_not_created = 3;
            ev.trip = TRIP_DEFAULT;
            ev.n_trip = 3;
        }
        enum cls_outcome got = cls_classify(&ev);
        if (got != rows[i].want)
            fail_msg("row %zu: got %s, want %s", i, cls_name(got), cls_name(rows[i].want));
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
        {{OPERATION_TIMEDOUT, 300, 0, 0, 0, 0, NULL, 0, NULL, 0}, 1}, /* ambiguous */
        {{COULDNT_CONNECT, 0, 0, 0, 0, 0, NULL, 0, NULL, 0}, 0},      /* not sent */
        {{OK, 300, 150, 429, 0, 1, NULL, 0, NULL, 0}, 0},             /* declared not created */
        {{OK, 300, 150, 503, 0, 1, NOT_CREATED_503, 4, NULL, 0}, 0},
        {{OK, 300, 150, 502, 0, 1, NULL, 0, NULL, 0}, 1},             /* 5xx under a key */
        {{OK, 300, 150, 409, 0, 1, NULL, 0, NULL, 0}, 1},             /* in flight: it exists */
        {{OK, 300, 150, 400, 0, 1, NULL, 0, NULL, 0}, 0},
        {{OK, 300, 150, 200, 0, 0, NULL, 0, NULL, 0}, 0},
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
    assert_string_equal(cls_name(CLS__COUNT), "invalid");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_may_have_created),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
