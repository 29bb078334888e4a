#ifndef IDEMGATE_PROBLEM_H
#define IDEMGATE_PROBLEM_H

#include <stddef.h>

/* The body of every error the gateway answers, as a pure function: an RFC 9457 problem document
 * (application/problem+json) whose members type, title, status, detail and request_id are the
 * gateway's contract, plus one extension member (RFC 9457 §3.2) for the SDKs written against
 * OpenAI-style APIs, which read nothing but `error.message`, `error.type` and `error.code`:
 *
 *   {"type":"urn:idemgate:problem:<type>","title":…,"status":…,"detail":…,"request_id":…,
 *    "error":{"message":"<title>: <detail>","type":"<error type>","code":"<type>"}}
 *
 * Without the extension such an SDK reports "422 status code (no body)" and drops our text. */

#define PROBLEM_CONTENT_TYPE "application/problem+json"

/* Bytes a buffer needs to hold any rendered problem (with its NUL). */
#define PROBLEM_BODY_MAX 2048

/* Longest parts kept, in escaped bytes; longer ones are cut at a character boundary. */
#define PROBLEM_TYPE_MAX 64
#define PROBLEM_TITLE_MAX 256
#define PROBLEM_DETAIL_MAX 512
#define PROBLEM_REQUEST_ID_MAX 80

struct problem {
    int status;             /* the HTTP status, 400..599 */
    const char *type;       /* the URN's last segment, e.g. "idempotency-key-reused" */
    const char *title;      /* short, the same for every instance of the type */
    const char *detail;     /* this instance's explanation; NULL: the title */
    const char *request_id; /* the answer's X-Request-Id; NULL: "" */
};

/* The OpenAI-style `error.type` of a status: "authentication_error" (401), "insufficient_quota"
 * (402), "permission_error" (403), "rate_limit_error" (429), "invalid_request_error" (any other
 * 4xx), "server_error" (5xx and anything else). */
const char *problem_error_type(int status);

/* Writes p's document into out (cap bytes, NUL-terminated) and returns its length. With cap >=
 * PROBLEM_BODY_MAX the document is always whole, valid JSON in valid UTF-8: strings are
 * escaped, bytes that are not UTF-8 become U+FFFD, and a part longer than its maximum is cut
 * at a character boundary. `error.message` is "<title>: <detail>", or the title alone when
 * there is no detail or the detail is the title. With a smaller cap, writes "" and returns 0. */
size_t problem_render(const struct problem *p, char *out, size_t cap);

#endif
