#include "idemgate/states.h"

#include <string.h>

static const char *const names[ST__COUNT] = {
    "prepared", "sending", "accepted", "unknown", "review", "completed", "failed", "canceled",
};

/* allowed[from] is a bit set of the states `from` may move to. */
#define B(s) (1u << (s))
static const unsigned allowed[ST__COUNT] = {
    /* Canceled (or abandoned) before anything was sent: failed; canceled while waiting to be
     * sent again after an attempt that may have made the task: unknown (reconcile, never send). */
    [ST_PREPARED] = B(ST_SENDING) | B(ST_FAILED) | B(ST_UNKNOWN),
    /* A call's outcome; prepared only when libcurl proves no byte left (or a definite answer
     * says try again later); unknown when nobody can know. */
    [ST_SENDING] = B(ST_PREPARED) | B(ST_ACCEPTED) | B(ST_UNKNOWN) | B(ST_COMPLETED) | B(ST_FAILED),
    /* A task's end: its result, its failure, or its cancel at our request (canceled); review
     * when its poll deadline passed before it ended. */
    [ST_ACCEPTED] = B(ST_COMPLETED) | B(ST_FAILED) | B(ST_CANCELED) | B(ST_REVIEW),
    /* Reconciliation: found, proven absent, resent under the same provider key, or escalated. */
    [ST_UNKNOWN] = B(ST_SENDING) | B(ST_PREPARED) | B(ST_ACCEPTED) | B(ST_COMPLETED) |
                   B(ST_REVIEW) | B(ST_FAILED), /* failed: cancelled, then proven absent */
    /* An operator's resolution; unknown when the found task is read before it is adopted. */
    [ST_REVIEW] = B(ST_PREPARED) | B(ST_ACCEPTED) | B(ST_COMPLETED) | B(ST_FAILED) |
                  B(ST_UNKNOWN),
    [ST_COMPLETED] = 0,
    [ST_FAILED] = 0,
    [ST_CANCELED] = 0,
};
#undef B

const char *st_name(enum op_state s)
{
    return (unsigned)s < ST__COUNT ? names[s] : "invalid";
}

int st_parse(const char *s)
{
    for (int i = 0; i < ST__COUNT; i++)
        if (strcmp(names[i], s) == 0)
            return i;
    return -1;
}

int st_is_terminal(enum op_state s)
{
    return s == ST_COMPLETED || s == ST_FAILED || s == ST_CANCELED;
}

int st_is_initial(enum op_state s)
{
    /* A row born reserved for a worker is prepared too: nothing was sent. */
    return s == ST_PREPARED;
}

int st_can_transition(enum op_state from, enum op_state to)
{
    if ((unsigned)from >= ST__COUNT || (unsigned)to >= ST__COUNT)
        return 0;
    return (allowed[from] >> to) & 1u;
}

int st_resolution_parse(const char *s)
{
    static const char *const res[] = {"found", "absent", "abandon"};
    for (int i = 0; s && i < 3; i++)
        if (strcmp(res[i], s) == 0)
            return i;
    return -1;
}

enum op_state st_resolve_target(enum st_resolution r, int async, int readable,
                                int cancel_requested)
{
    switch (r) {
    case RES_FOUND:
        return async ? ST_ACCEPTED : readable ? ST_UNKNOWN : ST_COMPLETED;
    case RES_ABSENT:
        return cancel_requested ? ST_FAILED : ST_PREPARED;
    case RES_ABANDON:
    default:
        return ST_FAILED;
    }
}

int st_resend_refused(enum st_resolution r, enum op_state next, int task_known, int forced)
{
    (void)next;
    return r == RES_ABSENT && task_known && !forced;
}

const char *st_seen_by(const char *seen)
{
    if (strcmp(seen, SEEN_STREAM_BEGAN) == 0)
        return "by its create's 2xx event stream:";
    return strncmp(seen, SEEN_CREATE_ANSWERED, strlen(SEEN_CREATE_ANSWERED)) == 0
               ? "by its create's answer:"
               : "by the reconciler without its id:";
}
