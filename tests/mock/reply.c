/*
 * idemgate-mock: building and sending HTTP responses (see reply.h).
 */
#include "reply.h"

#include <stdlib.h>
#include <string.h>

/* Initialises an empty reply with status 0 and no body. */
void reply_init(struct mock_reply *r)
{
    memset(r, 0, sizeof(*r));
    r->content_type = "application/json";
}

/* Releases the body of r and returns it to the empty state; safe to call twice. */
void reply_free(struct mock_reply *r)
{
    free(r->body);
    reply_init(r);
}

/*
 * Serialises doc as the JSON body of r with the given status and frees doc.  Returns
 * false when memory ran out; r keeps no body then.
 */
bool reply_set_json(struct mock_reply *r, unsigned int status, cJSON *doc)
{
    char *text = doc ? cJSON_PrintUnformatted(doc) : NULL;

    cJSON_Delete(doc);
    free(r->body);
    r->body = text;
    r->body_len = text ? strlen(text) : 0;
    r->status = status;
    r->content_type = "application/json";
    return text != NULL;
}

/*
 * Makes r an error in OpenAI's shape {"error": {"message", "type", "code"}} with the given
 * status.  Returns false when memory ran out.
 */
bool reply_set_error(struct mock_reply *r, unsigned int status, const char *message,
                     const char *type, const char *code)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(doc, "error");

    cJSON_AddStringToObject(err, "message", message);
    cJSON_AddStringToObject(err, "type", type);
    cJSON_AddStringToObject(err, "code", code);
    return reply_set_json(r, status, doc);
}

/*
 * Adds the Content-Type, Retry-After, Idempotent-Replayed and extra headers that r asks
 * for.
 */
void reply_add_headers(struct MHD_Response *resp, const struct mock_reply *r)
{
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type);
    if (r->retry_after[0] != '\0')
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, r->retry_after);
    if (r->replayed)
        MHD_add_response_header(resp, "Idempotent-Replayed", "true");
    if (r->extra_header)
        MHD_add_response_header(resp, r->extra_header, r->extra_value);
}

/*
 * Queues resp with the given status on the request's connection, records the status for
 * the log line and drops the caller's reference to resp.  Returns libmicrohttpd's verdict.
 */
enum MHD_Result reply_queue(struct mock_request *req, unsigned int status,
                            struct MHD_Response *resp)
{
    enum MHD_Result ret;

    if (resp == NULL)
        return MHD_NO;
    ret = MHD_queue_response(req->conn, status, resp);
    MHD_destroy_response(resp);
    if (ret == MHD_YES)
        req->log_status = status;
    return ret;
}

/* Sends r in full as an ordinary response.  The body stays owned by r. */
enum MHD_Result reply_send(struct mock_request *req, const struct mock_reply *r)
{
    struct MHD_Response *resp;

    /*
     * libmicrohttpd 0.9.75 has no "copy" constructor of its own; MUST_COPY makes it take a
     * private copy so that r can be freed or kept for an idempotent replay.
     */
    resp =
        MHD_create_response_from_buffer(r->body_len, r->body ? r->body : "", MHD_RESPMEM_MUST_COPY);
    if (resp == NULL)
        return MHD_NO;
    reply_add_headers(resp, r);
    return reply_queue(req, r->status, resp);
}

/* Sends doc as a JSON response with the given status and frees doc. */
enum MHD_Result reply_json(struct mock_request *req, unsigned int status, cJSON *doc)
{
    struct mock_reply r;
    enum MHD_Result ret;

    reply_init(&r);
    if (!reply_set_json(&r, status, doc))
        return MHD_NO;
    ret = reply_send(req, &r);
    reply_free(&r);
    return ret;
}

/* Sends an OpenAI-shaped JSON error with the given status. */
enum MHD_Result reply_error(struct mock_request *req, unsigned int status, const char *message,
                            const char *type, const char *code)
{
    struct mock_reply r;
    enum MHD_Result ret;

    reply_init(&r);
    if (!reply_set_error(&r, status, message, type, code))
        return MHD_NO;
    ret = reply_send(req, &r);
    reply_free(&r);
    return ret;
}
