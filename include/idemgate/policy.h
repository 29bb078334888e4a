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
};

struct pol_decision {
    enum op_state next;
    long long delay_ms;  /* when next is prepared (or unknown): wait this long */
    int trip_credential; /* stop dispatching to this provider until reset */
    const char *reason;  /* a short static phrase for last_error, or NULL */
};

struct pol_decision pol_decide(const struct pol_input *in);

#endif
