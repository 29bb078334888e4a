/*
 * idemgate-mock: building and sending HTTP responses.
 *
 * A create handler first decides a struct mock_reply (status, body, extra headers) and
 * only then chooses how to deliver it: normally, or through one of the faults in faults.c,
 * which reuse the header and queueing helpers declared here.
 */
#ifndef IDEMGATE_MOCK_REPLY_H
#define IDEMGATE_MOCK_REPLY_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "mock.h"

/* Longest Retry-After value the mock will echo, including the terminating NUL. */
#define MOCK_RETRY_AFTER_MAX 64

/* A response that has been decided but not yet sent. */
struct mock_reply {
    unsigned int status;
    char *body; /* heap-allocated, owned by the reply */
    size_t body_len;
    const char *content_type;               /* static string */
    char retry_after[MOCK_RETRY_AFTER_MAX]; /* empty when no Retry-After header is sent */
    bool replayed;                          /* adds "Idempotent-Replayed: true" */
    const char *extra_header;               /* static name of one more header, or NULL */
    char extra_value[64];                   /* its value */
};

/* Initialises an empty reply with status 0 and no body. */
void reply_init(struct mock_reply *r);

/* Releases the body of r and returns it to the empty state; safe to call twice. */
void reply_free(struct mock_reply *r);

/*
 * Serialises doc as the JSON body of r with the given status and frees doc.  Returns
 * false when memory ran out; r keeps no body then.
 */
bool reply_set_json(struct mock_reply *r, unsigned int status, cJSON *doc);

/*
 * Makes r an error in OpenAI's shape {"error": {"message", "type", "code"}} with the given
 * status.  Returns false when memory ran out.
 */
bool reply_set_error(struct mock_reply *r, unsigned int status, const char *message,
                     const char *type, const char *code);

/*
 * Adds the Content-Type, Retry-After, Idempotent-Replayed and extra headers that r asks
 * for.
 */
void reply_add_headers(struct MHD_Response *resp, const struct mock_reply *r);

/*
 * Queues resp with the given status on the request's connection, records the status for
 * the log line and drops the caller's reference to resp.  Returns libmicrohttpd's verdict.
 */
enum MHD_Result reply_queue(struct mock_request *req, unsigned int status,
                            struct MHD_Response *resp);

/* Sends r in full as an ordinary response.  The body stays owned by r. */
enum MHD_Result reply_send(struct mock_request *req, const struct mock_reply *r);

/* Sends doc as a JSON response with the given status and frees doc. */
enum MHD_Result reply_json(struct mock_request *req, unsigned int status, cJSON *doc);

/* Sends an OpenAI-shaped JSON error with the given status. */
enum MHD_Result reply_error(struct mock_request *req, unsigned int status, const char *message,
                            const char *type, const char *code);

#endif
