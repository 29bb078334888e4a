#ifndef IDEMGATE_GATE_H
#define IDEMGATE_GATE_H

#include "idemgate/profile.h"

#include <stddef.h>

/* The tenant gate (issue 21 §6). Every path that can create at a provider passes it — a new
 * intent (intake), a regeneration, and an operator's `absent` that sends an operation again —
 * so that none of them is a way around the tenant's limits:
 *   1. its requests per second (limits.h, this replica's token bucket), before anything is
 *      recorded;
 *   2. its price: the estimate to reserve, and whether the price table prices the request with
 *      nothing (pricing.h);
 *   3. its jobs in flight, the day's and the month's amounts, and an unpriced request under an
 *      amount budget: the store's verdict, taken in the creation's own commit (the functions
 *      idemgate_intake and idemgate_regenerate, migrations 0014 and 0023) so that it holds
 *      across replicas; a refusal is answered by gate_reply_refused.
 * A regeneration is priced by its parent's stored estimate and unpriced flag; an operator's
 * resend is held by the reservation and the in-flight slot its operation keeps until it ends.
 * Both pass gate_admit with no provider (p NULL): the rate is theirs to pass here. */

struct hs_req;

struct gate_req {
    const char *token_hash;       /* the SHA-256 hex of the tenant's token (the creation's) */
    const struct cfg_provider *p; /* NULL: the store prices it from what it stored */
    const char *body;             /* the request as it will be sent (len bytes) */
    size_t len;
    int outputs; /* outputs asked for (< 1: one) */
};

struct gate_pass {
    long long reserve_micros; /* the estimate the store reserves (0: no price table) */
    const char *currency;     /* the price table's currency, or NULL */
    int unpriced;             /* the table prices this request with nothing */
};

/* Passes one creation through the gate's first two steps (the rate limit is read again when
 * due: api_limits_refresh). Returns 0 with *out filled when it may be recorded, or the
 * Retry-After in seconds (> 0) when the tenant is over its requests per second: then nothing is
 * to be recorded, and gate_reply_rate answers. */
int gate_admit(struct hs_req *r, const struct gate_req *q, struct gate_pass *out);

/* 429 rate-limited with Retry-After: the tenant's requests per second are used up. */
void gate_reply_rate(struct hs_req *r, int retry_after);

/* 1 when e, a store error of a creation, is the gate's third step refusing it. */
int gate_refused(int e);

/* Answers that refusal: 402 budget-exceeded (with the estimate when estimate_micros >= 0),
 * 402 unpriced-under-budget, or 429 too-many-in-flight. Nothing was recorded or sent. */
void gate_reply_refused(struct hs_req *r, int e, long long estimate_micros, const char *currency);

#endif
