#ifndef IDEMGATE_CLASSIFY_H
#define IDEMGATE_CLASSIFY_H

#include <stddef.h>

/* Outcome classification of one outbound call: pure, table-tested. The evidence rules follow
 * what libcurl 7.88 reports on this platform (STYLE.md): REQUEST_SIZE == 0 means no byte left;
 * bytes sent with HEADER_SIZE == 0 means sent without any answer; HEADER_SIZE > 0 means a
 * response started, and its status line is a definite answer. */

enum cls_outcome {
    CLS_NOT_SENT = 0,     /* nothing left this host: safe to send */
    CLS_REJECTED_REQUEST, /* a definite 4xx about the request: failed, no retry */
    CLS_REJECTED_ACCOUNT, /* evidence about the credential (a 401, or another trip status whose
                           * body carries a marker the profile declares): failed, and the
                           * credential is suspect (confirmed by the probe before it trips) */
    CLS_BACKOFF,          /* a status proving nothing was made (or any status under a native
                           * key): try again later */
    CLS_AMBIGUOUS,        /* sent, no definite answer: the task may exist */
    CLS_SUCCESS,          /* 2xx with a complete body */
    CLS_PARTIAL,          /* 2xx with fewer outputs than asked */
    CLS_REJECTED_UNMARKED, /* a trip status other than 401 without any declared marker: often
                            * about this one request (a model the account may not use, a content
                            * policy), so only this job fails; nothing trips */
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
     * may be about the credential (auth.trip_statuses). */
    const int *not_created;
    int n_not_created;
    const int *trip;
    int n_trip;
    /* The answer's body (body_len bytes, not NUL-terminated; may be NULL) and the profile's
     * auth.trip_markers: a listed status other than 401 is about the credential only when the
     * body contains one of the markers (a byte-exact substring). 401 needs none. */
    const char *body;
    size_t body_len;
    const char *const *markers;
    int n_markers;
    int stream_cut; /* a 2xx event stream without its terminal event, or with an error event:
                     * the provider accepted and generated, the answer is not whole */
    /* The status the stream's first error event stands for (sse_error_status), when it came
     * before any generated output; 0 otherwise. Such an event is classified as that status
     * would be before the stream began (an `overloaded_error` as a 529): nothing was generated.
     * An error after output, or of an unknown type, leaves the stream cut: ambiguous. */
    int stream_error_status;
    /* libcurl was about to send the request again on a new connection, the reused one having
     * died before any answer, and was refused (upstream.h). bytes_sent counts the dead
     * connection's bytes: none left (not sent), or some did and the provider may have read
     * them (ambiguous) — never a status's class, never a resend of our own. */
    int resend_refused;
    /* A 2xx event stream read whole: its terminal event, no error event, nothing left out. It is
     * the answer whatever broke after it (a connection closed without the chunked body's last
     * chunk, or kept open past the end and cut): never ambiguous for the transfer's own end. */
    int stream_whole;
};

enum cls_outcome cls_classify(const struct cls_evidence *e);
/* 1 when, whatever the class, the evidence leaves open that this attempt made a task: an
 * ambiguous outcome, or a status outside not_created that is only a safe resend because of a
 * native key (a 5xx after the origin accepted, a 409 "in flight"). Such an operation can never
 * end `failed` by an exhausted budget afterwards. */
int cls_may_have_created(const struct cls_evidence *e, enum cls_outcome o);
const char *cls_name(enum cls_outcome o);

/* 1 when body[0..len) contains one of markers[0..n) (non-empty, NUL-terminated strings). */
int cls_body_marked(const char *body, size_t len, const char *const *markers, int n);

/* What the provider's probe (an authenticated GET of the profile's probe.path, made right
 * after a create was classified CLS_REJECTED_ACCOUNT) said about the credential. */
enum cls_probe {
    CLS_PROBE_NONE = 0,  /* the profile has no probe */
    CLS_PROBE_OK,        /* a 2xx: the credential works */
    CLS_PROBE_REFUSED,   /* one of the profile's trip statuses */
    CLS_PROBE_NO_ANSWER, /* no status line, or any other status: proves nothing */
};
/* The probe's class for an answer (http_status 0: none came). */
enum cls_probe cls_probe_class(int http_status, const int *trip, int n_trip);
/* 1 when the credential is tripped for every tenant: the create's evidence was about the
 * credential, and the probe does not contradict it. Without a probe the evidence alone trips
 * (nothing can refute it; an operator's reset or a probe added later clears it); a probe that
 * answers 2xx refutes it (only the job fails); a probe that refuses or proves nothing leaves the
 * evidence standing. */
int cls_trip_confirmed(enum cls_outcome o, enum cls_probe probe);


#endif
