#include "idemgate/jobview.h"

#include "idemgate/jcs.h"

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_str(cJSON *o, const char *k, const char *v)
{
    if (v)
        cJSON_AddStringToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

/* How deep a provider's body may nest to be embedded as is (the configuration's most). */
#define BODY_MAX_DEPTH 1024

/* Whether bytes are one JSON value by RFC 8259's grammar: what a client's parser takes. cJSON
 * takes more (`01`, raw control characters in a string): embedded as is, such a body made the
 * whole job view unreadable to the client's parser, its paid result with it. The strict parse
 * also refuses a repeated member name, a number past a double's range and invalid UTF-8: such a
 * body is given in base64 too, never embedded for a client to read one way or another. */
static int strict_json(const unsigned char *b, size_t n)
{
    struct jcs_doc *doc = NULL;
    if (jcs_parse((const char *)b, n, BODY_MAX_DEPTH, &doc, NULL) != 0)
        return 0;
    jcs_doc_free(doc);
    return 1;
}

/* The provider's body as JSON when it is JSON (embedded as is, so big numbers and key order
 * survive), otherwise base64. */
static void add_body(cJSON *result, const struct store_job *j)
{
    if (!j->resp_body)
        return;
    if (strict_json(j->resp_body, j->resp_body_len)) {
        cJSON_AddItemToObject(result, "body", cJSON_CreateRaw((const char *)j->resp_body));
        return;
    }
    size_t cap = 4 * ((j->resp_body_len + 2) / 3) + 1;
    unsigned char *b64 = malloc(cap);
    if (!b64)
        return;
    EVP_EncodeBlock(b64, j->resp_body, (int)j->resp_body_len);
    cJSON_AddStringToObject(result, "body_base64", (const char *)b64);
    free(b64);
}

/* Who the job is: its identity, state, routing, the provider's task and lineage, and its
 * attempt counters. */
static void add_identity(cJSON *o, const struct store_job *j)
{
    add_str(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", "job");
    add_str(o, "state", st_name(j->state));
    cJSON_AddBoolToObject(o, "terminal", st_is_terminal(j->state));
    add_str(o, "provider", j->provider);
    add_str(o, "route", j->route);
    add_str(o, "idempotency_key", j->idempotency_key);
    if (j->tenant) /* the operator's reads: whose job it is */
        add_str(o, "tenant", j->tenant);
    /* "": the last attempt's stream named none (an earlier attempt's id was cleared) */
    add_str(o, "remote_id", j->remote_id && *j->remote_id ? j->remote_id : NULL);
    add_str(o, "parent_id", j->parent_id);
    cJSON *att = cJSON_AddObjectToObject(o, "attempts");
    cJSON_AddNumberToObject(att, "transport", j->transport_attempts);
    cJSON_AddNumberToObject(att, "generation", j->generation_attempts);
}

static void add_times(cJSON *o, const struct store_job *j)
{
    add_str(o, "created_at", j->created_at);
    add_str(o, "updated_at", j->updated_at);
    add_str(o, "first_sent_at", j->first_sent_at);
    add_str(o, "finished_at", j->finished_at);
    add_str(o, "expires_at", j->expires_at);
}

/* The provider's stored answer: status, allow-listed headers, body and outputs; null before
 * any. */
static void add_result(cJSON *o, const struct store_job *j)
{
    if (!j->resp_status) {
        cJSON_AddNullToObject(o, "result");
        return;
    }
    cJSON *result = cJSON_AddObjectToObject(o, "result");
    cJSON_AddNumberToObject(result, "status", j->resp_status);
    if (j->resp_headers)
        cJSON_AddItemToObject(result, "headers", cJSON_CreateRaw(j->resp_headers));
    add_body(result, j);
    if (j->outputs)
        cJSON_AddItemToObject(result, "outputs", cJSON_CreateRaw(j->outputs));
}

/* Outputs asked for and delivered, and the shortfall when both are known; absent when neither
 * is counted. */
static void add_output_counts(cJSON *o, const struct store_job *j)
{
    if (j->outputs_requested < 0 && j->outputs_received < 0)
        return;
    cJSON *outs = cJSON_AddObjectToObject(o, "outputs");
    if (j->outputs_requested >= 0)
        cJSON_AddNumberToObject(outs, "requested", j->outputs_requested);
    if (j->outputs_received >= 0)
        cJSON_AddNumberToObject(outs, "received", j->outputs_received);
    if (j->outputs_requested >= 0 && j->outputs_received >= 0)
        cJSON_AddNumberToObject(outs, "shortfall",
                                j->outputs_received < j->outputs_requested
                                    ? j->outputs_requested - j->outputs_received
                                    : 0);
}

/* The estimate reserved at intake and the settled cost (null until the job ends); null for a
 * provider without a price table. */
static void add_cost(cJSON *o, const struct store_job *j)
{
    if (!j->currency) {
        cJSON_AddNullToObject(o, "cost");
        return;
    }
    cJSON *cost = cJSON_AddObjectToObject(o, "cost");
    cJSON_AddStringToObject(cost, "currency", j->currency);
    cJSON_AddNumberToObject(cost, "estimate_micros", (double)j->reserved_micros);
    if (j->cost_micros >= 0)
        cJSON_AddNumberToObject(cost, "micros", (double)j->cost_micros);
    else
        cJSON_AddNullToObject(cost, "micros");
}

/* An operator's decision, when one was made. */
static void add_resolution(cJSON *o, const struct store_job *j)
{
    if (!j->resolution)
        return;
    cJSON *res = cJSON_AddObjectToObject(o, "resolution");
    add_str(res, "outcome", j->resolution);
    add_str(res, "by", j->resolved_by);
    add_str(res, "at", j->resolved_at);
}

/* Where the job stands on its way: held back by a tripped credential (only while it can still
 * move), the provider's task status and profile, status reads, a cancel, the last error. */
static void add_progress(cJSON *o, const struct store_job *j)
{
    if (j->blocked_reason && !st_is_terminal(j->state)) {
        cJSON *b = cJSON_AddObjectToObject(o, "blocked");
        add_str(b, "reason", j->blocked_reason);
    }
    add_str(o, "provider_status", j->provider_status);
    /* The profile's id, without the digest stored with it (profile.h, profile_stamp). */
    const char *stamp = j->profile_id ? strrchr(j->profile_id, '#') : NULL;
    char id[256];
    if (stamp)
        snprintf(id, sizeof(id), "%.*s", (int)(stamp - j->profile_id), j->profile_id);
    add_str(o, "profile", stamp ? id : j->profile_id);
    cJSON_AddNumberToObject(o, "polls", j->polls);
    if (j->cancel_requested_at)
        add_str(o, "cancel_requested_at", j->cancel_requested_at);
    add_str(o, "last_error", j->last_error);
}

static void add_links(cJSON *o, const struct store_job *j)
{
    char self[64];
    snprintf(self, sizeof(self), "/v1/jobs/%s", j->id);
    cJSON *links = cJSON_AddObjectToObject(o, "links");
    cJSON_AddStringToObject(links, "self", self);
}

char *jobview_json(const struct store_job *j)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    add_identity(o, j);
    add_times(o, j);
    add_result(o, j);
    add_output_counts(o, j);
    add_cost(o, j);
    if (j->archive)
        cJSON_AddItemToObject(o, "archive", cJSON_CreateRaw(j->archive));
    if (j->usage)
        cJSON_AddItemToObject(o, "usage", cJSON_CreateRaw(j->usage));
    else
        cJSON_AddNullToObject(o, "usage");
    add_resolution(o, j);
    add_progress(o, j);
    add_links(o, j);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

int jobview_stored_header(const struct store_job *j, const char *name, char *out, size_t outlen)
{
    if (!j->resp_headers)
        return -1;
    cJSON *h = cJSON_Parse(j->resp_headers);
    const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(h, name));
    int rc = -1;
    if (v && strlen(v) < outlen) {
        strcpy(out, v);
        rc = 0;
    }
    cJSON_Delete(h);
    return rc;
}
