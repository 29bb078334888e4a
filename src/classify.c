#include "idemgate/classify.h"

static const char *const names[CLS__COUNT] = {
    "not_sent", "rejected_request", "rejected_account", "backoff", "ambiguous", "success", "partial",
};

const char *cls_name(enum cls_outcome o)
{
    return (unsigned)o < CLS__COUNT ? names[o] : "invalid";
}

static int listed(const int *list, int n, int status)
{
    for (int i = 0; i < n; i++)
        if (list[i] == status)
            return 1;
    return 0;
}

/* Classifies a definite HTTP status (a status line was received). */
static enum cls_outcome by_status(const struct cls_evidence *e, int status, int outputs_short)
{
    /* A provider that dedupes on our key answers 409 while the first request with that key is
     * still being processed: the task exists, so come back later, under the same key. */
    if (status == 409 && e->idempotent)
        return CLS_BACKOFF;
    if (status >= 200 && status < 300)
        return outputs_short ? CLS_PARTIAL : CLS_SUCCESS;
    if (listed(e->trip, e->n_trip, status))
        return CLS_REJECTED_ACCOUNT;
    if (listed(e->not_created, e->n_not_created, status))
        return CLS_BACKOFF;
    if (status >= 500) {
        /* 500/502/504/52x often come from a proxy or CDN after the origin accepted the work:
         * only a resend under the same native key is safe; otherwise nobody knows. */
        return e->idempotent ? CLS_BACKOFF : CLS_AMBIGUOUS;
    }
    if (status >= 400)
        return CLS_REJECTED_REQUEST;
    /* 1xx/3xx to a create we do not follow: nothing says whether the task exists. */
    return CLS_AMBIGUOUS;
}

int cls_may_have_created(const struct cls_evidence *e, enum cls_outcome o)
{
    if (o == CLS_AMBIGUOUS)
        return 1;
    return o == CLS_BACKOFF && e->http_status > 0 &&
           !listed(e->not_created, e->n_not_created, e->http_status);
}

enum cls_outcome cls_classify(const struct cls_evidence *e)
{
    if (e->curl_code == 0)
        return e->http_status ? by_status(e, e->http_status, e->outputs_short) : CLS_AMBIGUOUS;
    if (e->bytes_sent <= 0)
        return CLS_NOT_SENT;
    if (e->header_bytes > 0 && e->http_status > 0) {
        /* The response started and then broke (truncated body, timeout mid-body). A refusal
         * stays a refusal; a 2xx whose body was lost may hold a task we could not read. */
        if (e->http_status >= 200 && e->http_status < 300)
            return CLS_AMBIGUOUS;
        enum cls_outcome o = by_status(e, e->http_status, 0);
        return o == CLS_SUCCESS ? CLS_AMBIGUOUS : o;
    }
    return CLS_AMBIGUOUS;
}
