#include "idemgate/classify.h"

#include <string.h>

static const char *const names[CLS__COUNT] = {
    "not_sent",  "rejected_request", "rejected_account", "backoff",
    "ambiguous", "success",          "partial",          "rejected_unmarked",
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

int cls_body_marked(const char *body, size_t len, const char *const *markers, int n)
{
    for (int i = 0; body && i < n; i++) {
        size_t ml = markers[i] ? strlen(markers[i]) : 0;
        if (ml == 0 || ml > len)
            continue;
        for (size_t at = 0; at + ml <= len; at++)
            if (body[at] == markers[i][0] && memcmp(body + at, markers[i], ml) == 0)
                return 1;
    }
    return 0;
}

/* A trip status: a 401 is about the credential by definition; any other (402, 403…) is so only
 * when the body says it with a marker the profile declares, since providers also answer them
 * for one request (a model the account may not use, a content policy) and one tenant must not
 * be able to stop a provider for every tenant. */
static enum cls_outcome refused(const struct cls_evidence *e, int status)
{
    if (status == 401 || cls_body_marked(e->body, e->body_len, e->markers, e->n_markers))
        return CLS_REJECTED_ACCOUNT;
    return CLS_REJECTED_UNMARKED;
}

enum cls_probe cls_probe_class(int http_status, const int *trip, int n_trip)
{
    if (http_status >= 200 && http_status < 300)
        return CLS_PROBE_OK;
    for (int i = 0; i < n_trip; i++)
        if (trip[i] == http_status)
            return CLS_PROBE_REFUSED;
    return CLS_PROBE_NO_ANSWER;
}

int cls_trip_confirmed(enum cls_outcome o, enum cls_probe probe)
{
    return o == CLS_REJECTED_ACCOUNT && probe != CLS_PROBE_OK;
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
        return refused(e, status);
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

/* A 2xx stream whose error event came before any output stands for the error's status. */
static int stream_refused(const struct cls_evidence *e)
{
    return e->stream_cut && e->stream_error_status >= 400 && e->curl_code == 0 &&
           e->http_status >= 200 && e->http_status < 300;
}

int cls_may_have_created(const struct cls_evidence *e, enum cls_outcome o)
{
    if (o == CLS_AMBIGUOUS)
        return 1;
    int status = stream_refused(e) ? e->stream_error_status : e->http_status;
    return o == CLS_BACKOFF && status > 0 && !listed(e->not_created, e->n_not_created, status);
}

enum cls_outcome cls_classify(const struct cls_evidence *e)
{
    /* An error event before any output is the refusal it names, as its status would be — but
     * never a verdict on the credential: words inside a stream (which can echo a tenant's own
     * text) must not stop a provider for every tenant; it refuses this request only. */
    if (stream_refused(e)) {
        enum cls_outcome o = by_status(e, e->stream_error_status, 0);
        return o == CLS_REJECTED_ACCOUNT ? CLS_REJECTED_UNMARKED : o;
    }
    /* A stream cut before its terminal event was paid for what it generated: nobody knows
     * what a resend would cost, nor whether the first is still being billed. */
    if (e->stream_cut && e->http_status >= 200 && e->http_status < 300)
        return CLS_AMBIGUOUS;
    if (e->stream_whole && !e->stream_cut && e->http_status >= 200 && e->http_status < 300 &&
        !e->resend_refused)
        return by_status(e, e->http_status, e->outputs_short);
    if (e->resend_refused)
        return e->bytes_sent <= 0 ? CLS_NOT_SENT : CLS_AMBIGUOUS;
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
