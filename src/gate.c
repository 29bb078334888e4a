#include "idemgate/gate.h"

#include "idemgate/api.h"
#include "idemgate/db.h"
#include "idemgate/limits.h"
#include "idemgate/pricing.h"
#include "idemgate/reply.h"

int gate_admit(struct hs_req *r, const struct gate_req *q, struct gate_pass *out)
{
    out->reserve_micros = 0;
    out->currency = NULL;
    out->unpriced = 0;
    /* Only live tenants are limited (their tokens come from the database), so a 429 tells an
     * unproven token nothing. */
    api_limits_refresh(r);
    int wait = limits_admit(q->token_hash);
    if (wait > 0)
        return wait;
    if (q->p && q->p->pricing.present) {
        const struct price_table *t = &q->p->pricing;
        out->reserve_micros = price_estimate_raw(t, q->body, q->len, q->outputs);
        out->currency = t->currency;
        out->unpriced = price_unlisted_raw(t, q->body, q->len);
    }
    return 0;
}

void gate_reply_rate(struct hs_req *r, int retry_after)
{
    reply_problem(r, 429, "rate-limited", "Too many requests",
                  "this tenant's requests per second are used up; retry after Retry-After seconds "
                  "with the same Idempotency-Key",
                  retry_after > 0 ? retry_after : 1);
}

int gate_refused(int e)
{
    return e == STORE_EOVERDAY || e == STORE_EOVERMONTH || e == STORE_EINFLIGHT ||
           e == STORE_EUNPRICED;
}

void gate_reply_refused(struct hs_req *r, int e, long long estimate_micros, const char *currency)
{
    if (e == STORE_EUNPRICED)
        reply_problem(r, 402, "unpriced-under-budget", "Unpriced request under a budget",
                      "the provider's price table does not price this request (a model it does "
                      "not list) and the tenant has a budget: it would be counted as costing "
                      "nothing, so it is refused; nothing was recorded or sent. The operator can "
                      "add its price or the table's fallback_per_output",
                      0);
    else
        reply_budget_refused(r, e, estimate_micros, currency);
}
