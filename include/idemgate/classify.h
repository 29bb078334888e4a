#ifndef IDEMGATE_CLASSIFY_H
#define IDEMGATE_CLASSIFY_H

/* Outcome classification of one outbound call: pure, table-tested. The evidence rules follow
 * what libcurl 7.88 reports on this platform (STYLE.md): REQUEST_SIZE == 0 means no byte left;
 * bytes sent with HEADER_SIZE == 0 means sent without any answer; HEADER_SIZE > 0 means a
 * response started, and its status line is a definite answer. */

enum cls_outcome {
    CLS_NOT_SENT = 0,     /* nothing left this host: safe to send */
    CLS_REJECTED_REQUEST, /* a definite 4xx about the request: failed, no retry */
    CLS_REJECTED_ACCOUNT, /* 401/402/403: failed, and the credential is suspect */
    CLS_BACKOFF,          /* a status proving nothing was made (or any status under a native
                           * key): try again later */
    CLS_AMBIGUOUS,        /* sent, no definite answer: the task may exist */
    CLS_SUCCESS,          /* 2xx with a complete body */
    CLS_PARTIAL,          /* 2xx with fewer outputs than asked */
    CLS__COUNT
};

struct cls_evidence {
    int curl_code;     /* CURLcode of the transfer; 0 = CURLE_OK */
    long bytes_sent;   /* CURLINFO_REQUEST_SIZE */
    long header_bytes; /* CURLINFO_HEADER_SIZE */
    int http_status;   /* CURLINFO_RESPONSE_CODE; 0 when none */
    int outputs_short; /* 2xx carried fewer outputs than requested */
    int idempotent;    /* sent under a provider idempotency key: a 409 means "in flight" and
                        * any status is safe to resend under the same key */
    /* The profile's statuses that prove no task was made (retry.not_created_statuses) and that
     * mean the credential itself is refused (auth.trip_statuses). */
    const int *not_created;
    int n_not_created;
    const int *trip;
    int n_trip;
};

enum cls_outcome cls_classify(const struct cls_evidence *e);
/* 1 when, whatever the class, the evidence leaves open that this attempt made a task: an
 * ambiguous outcome, or a status outside not_created that is only a safe resend because of a
 * native key (a 5xx after the origin accepted, a 409 "in flight"). Such an operation can never
 * end `failed` by an exhausted budget afterwards. */
int cls_may_have_created(const struct cls_evidence *e, enum cls_outcome o);
const char *cls_name(enum cls_outcome o);


#endif
