#ifndef IDEMGATE_POLICY_H
#define IDEMGATE_POLICY_H

#include "idemgate/classify.h"
#include "idemgate/states.h"

/* What happens after one create attempt: pure, table-tested. It joins the outcome class with
 * the provider's retry settings and the operation's history. The randomness of the jitter is an
 * input, so the function is deterministic. */

struct pol_input {
    enum cls_outcome outcome;
    int attempts_made;     /* transport attempts, this one included */
    int max_attempts;      /* the provider's limit */
    long long elapsed_ms;  /* since the operation's first send */
    long long deadline_ms; /* the provider's total deadline */
    long long hint_ms;     /* the server's Retry-After (any form), or -1 */
    long long base_ms, cap_ms;
    double rand01; /* uniform in [0, 1) */
    /* An earlier attempt of this operation was ambiguous (its task may exist): it can then
     * never end `failed` here, only unknown (→ reconcile → review). */
    int ambiguous_before;
    int may_have_created; /* this attempt may have made the task (cls_may_have_created) */
    int truncated; /* a 2xx whose body exceeded the profile's cap: not a stored result */
    /* When the outcome is unknown: the first reconcile look comes after the interval; a
     * provider with no way to look (strategy none) waits out its recovery window instead. */
    int cannot_look;
    long long reconcile_interval_ms, recovery_window_ms;
    /* An async provider's whole 2xx to a create is only "accepted": the task must then be
     * polled, and without a task id read from the answer nobody knows which task was paid for
     * (unknown, reconciled at once). */
    int async;
    int task_id_read;       /* the answer carried a usable task id */
    int status_listed;      /* its status is one the profile lists as accepted */
    long long poll_interval_ms; /* the first status read comes this long after acceptance */
    /* This attempt is the reconciler's resend of an unknown create under the provider's own
     * idempotency key (idempotent_resubmit): it proved nothing absent. A "not now" (not sent,
     * back off) leaves it unknown, for the reconciler to resend inside its window and checks —
     * never `prepared`, which any dispatcher sends later as new, perhaps once the provider has
     * forgotten the key and would make a second task. */
    int from_unknown;
    /* A synchronous 2xx whose whole body the profile cannot read (not JSON, or empty): not the
     * provider's result, and its task may exist (attempt_results.unreadable). */
    int unreadable;
};

struct pol_decision {
    enum op_state next;
    long long delay_ms;  /* when next is prepared (or unknown): wait this long */
    int trip_credential; /* stop dispatching to this provider until reset */
    const char *reason;  /* a short static phrase for last_error, or NULL; after a whole 2xx it
                          * is the whole message, otherwise the caller adds the evidence */
    int ambiguous;       /* this attempt may have made the task: remember it on the row */
};

struct pol_decision pol_decide(const struct pol_input *in);

/* Whether pol_decide reads the server's hint and the random draw for this outcome: only a
 * resend's delay does (not sent, back off). Every other outcome decides the same whatever they
 * hold, so the caller gathers them — a parse of the answer's headers, a regex over its body, a
 * draw from the CSPRNG — only when this says so. */
int pol_needs_wait_inputs(enum cls_outcome outcome);

/* Whether a task's cancel was answered for good: a 2xx (cancelled, or cancelling), or a 4xx
 * that will not change (the task ended, cannot be cancelled) — 1: not sent again. A transport
 * error, a 3xx, a 5xx, 401 and 403 (a key rotated or refused), 404 (a task not visible yet),
 * 408, 409, 425 and 429: 0, sent again by the next poll. */
int pol_cancel_answered(int curl_code, int http_status);

/* Whether a due cancel is sent, by what the status read just before it showed (task_status, -1:
 * nothing readable): only to a task that still runs (queued or running). A task that ended is
 * concluded as it ended — a cancel that came too late changes nothing, and some providers'
 * cancel deletes the task (Luma's DELETE, Runway's "cancel or delete"): sent to a finished one
 * it destroyed the paid result. An unreadable status sends nothing either: read again next, the
 * cancel still due. */
int pol_cancel_after_read(int task_status);

/* The delay before an async task's next status read: the profile's interval_ms growing by half
 * with each read made (polls), capped at max_ms — never under the provider's own poll hint
 * (hint_ms, its hint header: OpenAI's openai-poll-after-ms) nor under what the read's answer asked
 * (server_ms: Retry-After in seconds or as a date, retry-after-ms, a body hint — a 429 on a status
 * read was read again in seconds), each counting up to POL_POLL_HINT_MAX_MS (a provider's
 * header asking a day would hold the task unread past its poll deadline). A hint < 0 is none.
 * Pure. */
#define POL_POLL_HINT_MAX_MS 3600000LL
long pol_poll_delay_ms(long interval_ms, long max_ms, int polls, long hint_ms,
                       long long server_ms);

/* How long after the read that showed a task running a cancel that deletes it may still leave
 * (seconds): a poller held up between the two (its result queue behind a slow database) would
 * otherwise delete a task that finished meanwhile, its paid outputs with it. */
#define POL_CANCEL_READ_FRESH_S 2.0

/* The last moment (monotonic seconds) a poll's cancel may start leaving: its lease's (lease_by),
 * and, at a provider whose cancel deletes the task, no later than POL_CANCEL_READ_FRESH_S after
 * the read that showed the task running (read_at). Refused, the cancel stays due: the next poll
 * reads the task again first. Pure. */
double pol_cancel_by(int cancel_deletes, double lease_by, double read_at);

/* Whether a status read just after our cancel shows the task cancelled by it, at a provider
 * whose cancel deletes the task (cancel_deletes): the cancel accepted (2xx) and the task then
 * gone (404 or 410). The read before the cancel showed it running (pol_cancel_after_read), so
 * what it deleted was a task still running: `canceled`, not unreadable until review. */
int pol_deleted_by_cancel(int cancel_deletes, int cancel_http_status, int read_curl_code,
                          int read_http_status);

/* The state of a claimed create that can never be sent as recorded (e.g. its client reference
 * cannot be placed): failed, unless an earlier attempt was ambiguous (its task may exist), then
 * unknown. */
enum op_state pol_unsendable(int ambiguous_before);
/* Whether a claimed create may leave now. Under a native provider key (keyed), one of whose
 * attempts may have made the task (some attempt was ambiguous: a back-off after a 5xx) is sent
 * again only inside its recovery window, counted from its first send and never restarted by a
 * retry (DESIGN §2): the resend is safe only while the provider remembers the key, and a row
 * held in `prepared` past the window — its provider tripped by another job's refusal, its
 * credential missing on the replicas that claim it — would be sent once the provider may have
 * forgotten it, a second paid task. It is left to the reconciler, whose own window check
 * decides (review, once closed). Not held: a row an operator resolved `absent` (sent on that
 * word), and a keyless provider's (its `prepared` after an ambiguous attempt is a proven
 * absence: a new create, no key to be forgotten). */
int pol_send_in_window(int ambiguous_before, int keyed, int operator_absent,
                       long long since_first_ms, long recovery_window_ms);

#endif
