#include "idemgate/policy.h"

#include "idemgate/backoff.h"
#include "idemgate/profile.h"

static struct pol_decision by_outcome(const struct pol_input *in)
{
    struct pol_decision d = {ST_UNKNOWN, 0, 0, NULL, 0};
    switch (in->outcome) {
    case CLS_SUCCESS:
    case CLS_PARTIAL:
        if (in->truncated) {
            /* A task was made, but its answer is not whole: it cannot be the stored result. */
            d.next = ST_UNKNOWN;
            d.reason = "response larger than the profile's max_response_bytes";
            return d;
        }
        if (in->unreadable) {
            /* An egress proxy's page or a corrupted reply: the provider may have made the task,
             * and this is not its result (completed would keep it as the job's answer). */
            d.next = ST_UNKNOWN;
            d.reason = "a success status whose answer is not the provider's JSON";
            return d;
        }
        d.next = ST_COMPLETED;
        if (in->outcome == CLS_PARTIAL)
            d.reason = "partial result: fewer outputs than requested";
        return d;
    case CLS_REJECTED_REQUEST:
        d.next = ST_FAILED;
        d.reason = "the provider rejected the request";
        return d;
    case CLS_REJECTED_UNMARKED:
        /* Refused with a status that may be about the account, but nothing in the answer says
         * so: this job alone fails; the provider stays open for every other job. */
        d.next = ST_FAILED;
        d.reason = "the provider refused this request (its answer names no credential problem; "
                   "the credential is not tripped)";
        return d;
    case CLS_REJECTED_ACCOUNT:
        d.next = ST_FAILED;
        d.trip_credential = 1;
        d.reason = "the provider refused the credential";
        return d;
    case CLS_NOT_SENT:
    case CLS_BACKOFF: {
        /* Safe to send again: nothing left, or a definite "not now". Wait at least as long as
         * the server asked, with full jitter, inside the attempt limit and the deadline. A
         * definite answer came every time, so running out is `failed`, not `unknown`. */
        int attempt = in->attempts_made > 0 ? in->attempts_made - 1 : 0;
        long long delay = bo_full_jitter_ms(attempt, in->base_ms, in->cap_ms, in->rand01,
                                            in->hint_ms);
        if (bo_budget_allows(in->attempts_made, in->max_attempts, in->elapsed_ms,
                             in->deadline_ms, delay)) {
            d.next = ST_PREPARED;
            d.delay_ms = delay;
            d.reason = in->outcome == CLS_NOT_SENT ? "not sent; will retry"
                                                   : "provider asked to retry later";
        } else {
            d.next = ST_FAILED;
            d.reason = "retry budget exhausted";
        }
        return d;
    }
    case CLS_AMBIGUOUS:
    default:
        /* The task may exist: nobody resends without reconciling first. */
        d.next = ST_UNKNOWN;
        d.reason = "sent without a definite answer";
        return d;
    }
}

/* A whole 2xx from an async provider: accepted with its task id, else unknown. */
static struct pol_decision async_accepted(const struct pol_input *in)
{
    struct pol_decision d = {ST_ACCEPTED, in->poll_interval_ms, 0, NULL, 0};
    if (in->task_id_read)
        return d;
    d.next = ST_UNKNOWN;
    d.delay_ms = 0; /* reconciled at once: its plan decides whether it can look */
    d.ambiguous = 1;
    d.reason = in->status_listed ? "the provider accepted the create without a usable task id"
                                 : "unexpected success status for a create";
    return d;
}

struct pol_decision pol_decide(const struct pol_input *in)
{
    struct pol_decision d = by_outcome(in);
    long long not_before = 0;
    if (d.next == ST_COMPLETED && in->async)
        return async_accepted(in);
    if (d.next == ST_PREPARED && in->from_unknown) {
        d.next = ST_UNKNOWN;
        not_before = d.delay_ms; /* still no earlier than the server asked */
        d.reason = "asked to retry later on a resend after an ambiguous attempt: the "
                   "reconciler resends it, inside its window";
    }
    if (d.next == ST_FAILED && (in->ambiguous_before || in->may_have_created)) {
        /* An earlier send may have created the task: neither a refusal now nor a spent budget
         * proves that it did not, so the operation stays unknown and ends in review. */
        d.next = ST_UNKNOWN;
        d.reason = in->outcome == CLS_BACKOFF || in->outcome == CLS_NOT_SENT
                       ? "retry budget exhausted after an ambiguous attempt"
                       : "refused on a resend after an ambiguous attempt";
    }
    if (d.next == ST_UNKNOWN) {
        long long wait = in->cannot_look ? in->recovery_window_ms - in->elapsed_ms
                                         : in->reconcile_interval_ms;
        d.delay_ms = wait > not_before ? wait : not_before;
    }
    d.ambiguous = d.next == ST_UNKNOWN || in->may_have_created;
    return d;
}

int pol_needs_wait_inputs(enum cls_outcome outcome)
{
    return outcome == CLS_NOT_SENT || outcome == CLS_BACKOFF;
}

int pol_send_in_window(int ambiguous_before, int keyed, int operator_absent,
                       long long since_first_ms, long recovery_window_ms)
{
    return !ambiguous_before || !keyed || operator_absent || since_first_ms < recovery_window_ms;
}

enum op_state pol_unsendable(int ambiguous_before)
{
    return ambiguous_before ? ST_UNKNOWN : ST_FAILED;
}

int pol_cancel_answered(int curl_code, int http_status)
{
    if (curl_code || http_status <= 0)
        return 0;
    if (http_status >= 200 && http_status < 300)
        return 1;
    switch (http_status) {
    case 401: /* a key being rotated or refused: says nothing of the task */
    case 403:
    case 404: /* a task the provider named may not be visible yet */
    case 408:
    case 409:
    case 425:
    case 429:
        return 0;
    default:
        return http_status >= 400 && http_status < 500;
    }
}

int pol_cancel_after_read(int task_status)
{
    return task_status == TS_QUEUED || task_status == TS_RUNNING;
}

double pol_cancel_by(int cancel_deletes, double lease_by, double read_at)
{
    double fresh = read_at + POL_CANCEL_READ_FRESH_S;
    return cancel_deletes && fresh < lease_by ? fresh : lease_by;
}

int pol_deleted_by_cancel(int cancel_deletes, int cancel_http_status, int read_curl_code,
                          int read_http_status)
{
    return cancel_deletes && cancel_http_status >= 200 && cancel_http_status < 300 &&
           read_curl_code == 0 && (read_http_status == 404 || read_http_status == 410);
}

long pol_poll_delay_ms(long interval_ms, long max_ms, int polls, long hint_ms,
                       long long server_ms)
{
    long d = interval_ms;
    for (int i = 1; i < polls && d < max_ms; i++)
        d += d / 2;
    if (d > max_ms)
        d = max_ms;
    if (hint_ms > POL_POLL_HINT_MAX_MS)
        hint_ms = POL_POLL_HINT_MAX_MS;
    if (hint_ms > d)
        d = hint_ms;
    if (server_ms > POL_POLL_HINT_MAX_MS)
        server_ms = POL_POLL_HINT_MAX_MS;
    if (server_ms > d)
        d = (long)server_ms;
    return d;
}
