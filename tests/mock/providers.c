/*
 * idemgate-mock: provider personalities and the create pipeline they share
 * (see providers.h).
 */
#include "providers.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <openssl/evp.h>

#include "async.h"
#include "chaos.h"
#include "faults.h"
#include "form.h"
#include "idemkeys.h"
#include "ledger.h"
#include "reply.h"
#include "route.h"
#include "shapes.h"
#include "tasks.h"
#include "webhooks.h"

/* Bounds of the request's "n", as OpenAI's images API documents them. */
#define MIN_N 1u
#define MAX_N 10u

/* Output tokens billed per returned image, so usage reflects what was delivered. */
#define TOKENS_PER_OUTPUT 100u

/*
 * Renders an OpenAI-images-like answer: {"id", "created", "data": [{"url"}...], "usage"}.
 * The id is the task's, "task_<stem>", and the file names carry the stem (the ledger
 * sequence) so tests can tie a downloaded file to its create.
 */
static cJSON *render_images(const struct create_input *in, const char *stem)
{
    unsigned long output_tokens = (unsigned long)in->n_out * TOKENS_PER_OUTPUT;
    cJSON *doc = cJSON_CreateObject();
    cJSON *data, *usage;
    char id[LEDGER_TASK_ID_MAX];

    /* The keys are added in OpenAI's order, which keeps the bodies easy to compare by eye. */
    snprintf(id, sizeof(id), "task_%.20s", stem);
    cJSON_AddStringToObject(doc, "id", id);
    cJSON_AddNumberToObject(doc, "created", (double)time(NULL));
    data = cJSON_AddArrayToObject(doc, "data");
    usage = cJSON_AddObjectToObject(doc, "usage");
    if (data == NULL || usage == NULL) {
        cJSON_Delete(doc);
        return NULL;
    }
    for (unsigned int i = 0; i < in->n_out; i++) {
        cJSON *item = cJSON_CreateObject();
        char url[512];

        snprintf(url, sizeof(url), "%s/files/%s-%u.png", mock_base_url(), stem, i);
        if (in->b64) {
            /* The same bytes /files/ would serve, inline as OpenAI's b64_json. */
            char name[600], b64[1024];
            int len = snprintf(name, sizeof(name), "PNG:%s-%u.png", stem, i);
            EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)name, len);
            cJSON_AddStringToObject(item, "b64_json", b64);
        } else {
            cJSON_AddStringToObject(item, "url", url);
        }
        cJSON_AddItemToArray(data, item);
    }
    cJSON_AddNumberToObject(usage, "input_tokens", (double)in->prompt_len);
    cJSON_AddNumberToObject(usage, "output_tokens", (double)output_tokens);
    cJSON_AddNumberToObject(usage, "total_tokens", (double)(in->prompt_len + output_tokens));
    return doc;
}

/*
 * Every provider the mock simulates; a new personality is one more row.  Routes are tried
 * in table order, row by row, so a more specific pattern of a row comes before a more
 * general one (fal's status route before its create).
 */
static const struct mock_personality personality_table[] = {
    {
        .name = "openai-images",
        .routes = {{ROUTE_CREATE, "POST", "/v1/images/generations"},
                   {ROUTE_CREATE, "POST", "/v1/images/edits"},
                   {ROUTE_LOOKUP, "GET", "/v1/images/by-ref/{ref*}"},
                   {ROUTE_LIST, "GET", "/v1/images/tasks"},
                   {ROUTE_TASK, "GET", "/v1/images/tasks/{id}"}},
        .create_status = MHD_HTTP_OK,
        .render = render_images,
    },
    {
        .name = "native-idempotent",
        .routes = {{ROUTE_CREATE, "POST", "/v2/generations"},
                   {ROUTE_LOOKUP, "GET", "/v2/generations/by-ref/{ref*}"},
                   {ROUTE_LIST, "GET", "/v2/generations/tasks"},
                   {ROUTE_TASK, "GET", "/v2/generations/tasks/{id}"}},
        .create_status = MHD_HTTP_OK,
        .native_idempotency = true,
        .render = render_images,
    },
    {
        .name = "openai-videos",
        .routes = {{ROUTE_CREATE, "POST", "/v1/videos"},
                   {ROUTE_LIST, "GET", "/v1/videos"},
                   {ROUTE_POLL, "GET", "/v1/videos/{id}"},
                   {ROUTE_RESULT, "GET", "/v1/videos/{id}/content"}},
        .create_status = MHD_HTTP_OK,
        .async = &shape_openai_videos,
    },
    {
        .name = "replicate",
        .routes = {{ROUTE_CREATE, "POST", "/v1/models/{owner}/{name}/predictions"},
                   {ROUTE_LIST, "GET", "/v1/predictions"},
                   {ROUTE_POLL, "GET", "/v1/predictions/{id}"},
                   {ROUTE_CANCEL, "POST", "/v1/predictions/{id}/cancel"}},
        .create_status = MHD_HTTP_CREATED,
        .async = &shape_replicate,
    },
    {
        .name = "fal-queue",
        .routes = {{ROUTE_POLL, "GET", "/fal/{model+}/requests/{id}/status"},
                   {ROUTE_RESULT, "GET", "/fal/{model+}/requests/{id}"},
                   {ROUTE_CANCEL, "PUT", "/fal/{model+}/requests/{id}/cancel"},
                   {ROUTE_CREATE, "POST", "/fal/{model+}"}},
        .create_status = MHD_HTTP_OK,
        .async = &shape_fal,
    },
    {
        .name = "runway",
        .routes = {{ROUTE_CREATE, "POST", "/v1/image_to_video"},
                   {ROUTE_CREATE, "POST", "/v1/text_to_image"},
                   {ROUTE_POLL, "GET", "/v1/tasks/{id}"},
                   {ROUTE_CANCEL, "DELETE", "/v1/tasks/{id}"}},
        .create_status = MHD_HTTP_OK,
        .required_header = "X-Runway-Version",
        .async = &shape_runway,
    },
    {
        .name = "luma",
        .routes = {{ROUTE_CREATE, "POST", "/dream-machine/v1/generations"},
                   {ROUTE_LIST, "GET", "/dream-machine/v1/generations"},
                   {ROUTE_POLL, "GET", "/dream-machine/v1/generations/{id}"},
                   {ROUTE_CANCEL, "DELETE", "/dream-machine/v1/generations/{id}"}},
        .create_status = MHD_HTTP_CREATED,
        .async = &shape_luma,
    },
    {
        .name = "vertex-veo",
        .routes = {{ROUTE_CREATE, "POST",
                    "/v1/projects/{p}/locations/{l}/publishers/google/models/"
                    "{m}:predictLongRunning"},
                   {ROUTE_POLL, "POST",
                    "/v1/projects/{p}/locations/{l}/publishers/google/models/"
                    "{m}:fetchPredictOperation"}},
        .create_status = MHD_HTTP_OK,
        .async = &shape_vertex,
    },
    {
        .name = "keyed-async",
        .routes = {{ROUTE_CREATE, "POST", "/v1/keyed/generations"},
                   {ROUTE_LOOKUP, "GET", "/v1/keyed/by-ref/{ref*}"},
                   {ROUTE_POLL, "GET", "/v1/keyed/generations/{id}"}},
        .create_status = MHD_HTTP_ACCEPTED,
        .native_idempotency = true,
        .in_flight_until_answered = true,
        .async = &shape_keyed,
    },
};

/* One place a create's client reference can come from. */
struct ref_source {
    const char *name;   /* recorded in the ledger as client_ref_source */
    const char *header; /* a request header, or NULL when member is used */
    const char *member; /* a dotted path to a string in the JSON body, or NULL */
};

/* Where a create's client reference is looked for, highest priority first. */
static const struct ref_source ref_sources[] = {
    {"body", NULL, "metadata.client_ref"},
    {"x-client-ref", "X-Client-Ref", NULL},
    {"x-idemgate-operation", "X-Idemgate-Operation", NULL},
};

/* Writes the lower-case hex SHA-256 of data into hex (65 bytes). */
void mock_sha256_hex(const char *data, size_t len, char hex[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;

    if (EVP_Digest(data, len, md, &md_len, EVP_sha256(), NULL) != 1)
        md_len = 0;
    for (unsigned int i = 0; i < md_len && i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    hex[2 * (md_len < 32 ? md_len : 32)] = '\0';
}

/* Returns the TCP source port of the client, or 0 when it cannot be told. */
static unsigned int remote_port(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = info ? info->client_addr : NULL;

    if (sa == NULL)
        return 0;
    if (sa->sa_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)(const void *)sa)->sin_port);
    if (sa->sa_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)(const void *)sa)->sin6_port);
    return 0;
}

/*
 * Returns the string at a dotted path inside doc (such as "metadata.client_ref"), or NULL
 * when a step is missing or the value there is not a string.
 */
static const char *body_string(const cJSON *doc, const char *path)
{
    const cJSON *node = doc;

    while (node && *path) {
        size_t len = strcspn(path, ".");
        char step[64];

        if (len >= sizeof(step))
            return NULL;
        memcpy(step, path, len);
        step[len] = '\0';
        node = cJSON_IsObject(node) ? cJSON_GetObjectItemCaseSensitive(node, step) : NULL;
        path += len + (path[len] == '.');
    }
    return cJSON_IsString(node) ? node->valuestring : NULL;
}

/*
 * Fills rec's client_ref and client_ref_source from the first source in ref_sources that
 * has one.  doc is the parsed body, or NULL when it is not JSON.  The reference points
 * into doc or the request's headers, so doc must outlive rec's use.
 */
static void read_client_ref(struct MHD_Connection *conn, const cJSON *doc,
                            struct ledger_record *rec)
{
    for (size_t i = 0; i < sizeof(ref_sources) / sizeof(ref_sources[0]); i++) {
        const struct ref_source *src = &ref_sources[i];
        const char *ref = src->header
                              ? MHD_lookup_connection_value(conn, MHD_HEADER_KIND, src->header)
                              : body_string(doc, src->member);

        if (ref) {
            rec->client_ref = ref;
            rec->client_ref_source = src->name;
            return;
        }
    }
}

/* Reads "prompt" and "n" from the create body, applying the defaults and the clamp. */
static void read_input(const cJSON *doc, struct create_input *in)
{
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(doc, "prompt");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(doc, "n");

    in->prompt_len = cJSON_IsString(prompt) ? strlen(prompt->valuestring) : 0;
    in->n = MIN_N;
    if (cJSON_IsNumber(n)) {
        if (n->valuedouble >= MAX_N)
            in->n = MAX_N;
        else if (n->valuedouble > MIN_N)
            in->n = (unsigned int)n->valuedouble;
    }
    in->n_out = in->n;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(doc, "response_format");
    in->b64 = cJSON_IsString(fmt) && strcmp(fmt->valuestring, "b64_json") == 0;
}

/*
 * Records a create that is refused before the pipeline gets going (a bad body, a bad
 * control, a key in flight) and sends the matching error.
 */
static enum MHD_Result refuse(struct mock_request *req, struct ledger_record *rec,
                              unsigned int status, const char *message, const char *type,
                              const char *code)
{
    struct ledger_slot slot;

    rec->status = (int)status;
    if (!ledger_append(rec, &slot))
        fprintf(stderr, "idemgate-mock: ledger full or out of memory, create not recorded\n");
    return reply_error(req, status, message, type, code);
}

/*
 * Records a create that lacks the header its provider requires and answers 400 in the
 * provider's plain shape, {"error": "missing <header>"}, as Runway does for its version.
 */
static enum MHD_Result refuse_missing_header(struct mock_request *req, struct ledger_record *rec,
                                             const char *header)
{
    struct ledger_slot slot;
    cJSON *doc = cJSON_CreateObject();
    char message[128];

    rec->status = MHD_HTTP_BAD_REQUEST;
    if (!ledger_append(rec, &slot))
        fprintf(stderr, "idemgate-mock: ledger full or out of memory, create not recorded\n");
    snprintf(message, sizeof(message), "missing %s", header);
    cJSON_AddStringToObject(doc, "error", message);
    return reply_json(req, MHD_HTTP_BAD_REQUEST, doc);
}

/* The delay of a create: its own control, else its fault's default, else --delay-ms. */
static unsigned int effective_delay(const struct mock_controls *ctrl)
{
    if (ctrl->set & CTRL_DELAY)
        return ctrl->delay_ms;
    if ((ctrl->set & CTRL_FAULT) && ctrl->fault->default_delay_ms)
        return ctrl->fault->default_delay_ms;
    return mock_default_delay_ms();
}

/*
 * Merges the script entry (if any), the body's "_mock" object and the headers into *ctrl,
 * in that order of priority.  The script entry is consumed only here, after every refusal
 * that does not count as a create, so that a refused request never eats a scripted fault.
 * When none of them sets anything and random mode is on, the controls are drawn instead;
 * returns the name of the behaviour drawn, or NULL.
 */
static const char *resolve_controls(struct mock_controls *ctrl,
                                    const struct mock_controls *body_ctrl,
                                    const struct mock_controls *hdr_ctrl, bool async)
{
    memset(ctrl, 0, sizeof(*ctrl));
    faults_script_pop(ctrl);
    faults_merge(ctrl, body_ctrl);
    faults_merge(ctrl, hdr_ctrl);
    if (ctrl->set == 0)
        return chaos_draw(async, ctrl);
    return NULL;
}

/*
 * Returns why the request's own controls (body and headers, not the script) do not fit
 * personality p, or NULL when they do: the task controls are for asynchronous providers
 * only, and a webhook URL for providers that send webhooks.
 */
static const char *controls_misfit(const struct mock_personality *p,
                                   const struct mock_controls *body_ctrl,
                                   const struct mock_controls *hdr_ctrl)
{
    struct mock_controls merged = *body_ctrl;

    if (p->async == NULL && ((body_ctrl->set | hdr_ctrl->set) & CTRL_ASYNC))
        return "polls, poll_delay_ms, cancel_fails, outcome, error, outputs, filtered, webhook, "
               "id_numeric and id_missing apply to asynchronous providers only";
    if (p->async == NULL)
        return NULL;
    faults_merge(&merged, hdr_ctrl);
    return async_check_controls(p, &merged);
}

/* What the pipeline knows about one create while it builds the answer. */
struct create_state {
    struct mock_request *req;
    const struct mock_personality *p;
    const struct route_match *m;
    const cJSON *doc;
    const struct create_input *in;
    const struct mock_controls *ctrl;
    const struct ledger_record *rec;
    unsigned long seq;
    unsigned int status;
    bool makes_task;                   /* the create leaves a task behind */
    char task_id[LEDGER_ASYNC_ID_MAX]; /* an asynchronous task's id, empty for none */
    struct wh_event *events;           /* webhooks the creation sends, not yet queued */
    /*
     * The 2xx body of the task the create made (its result, and what a replay under a native
     * key answers), or NULL when it made none.  It is the reply's own body when the reply is
     * that 2xx body; otherwise (task_made with an error status) it is owned here.
     */
    const char *task_body;
    char *task_body_owned;
};

/*
 * Adds the member "pad": "xxx..." (pad "x" bytes) to the JSON object text, which it takes
 * over, and returns the new text; NULL when memory ran out.  The text is spliced rather than
 * built with cJSON so that a 64 MiB pad is copied once.
 */
static char *add_pad(char *text, size_t pad)
{
    size_t len = strlen(text), n;
    const char *member;
    size_t member_len;
    char *out;

    if (len < 2 || text[len - 1] != '}')
        return text;
    member = len == 2 ? "\"pad\":\"" : ",\"pad\":\"";
    member_len = strlen(member);
    out = malloc(len - 1 + member_len + pad + 3);
    if (out == NULL) {
        free(text);
        return NULL;
    }
    memcpy(out, text, len - 1);
    n = len - 1;
    memcpy(out + n, member, member_len);
    n += member_len;
    memset(out + n, 'x', pad);
    n += pad;
    memcpy(out + n, "\"}", 3);
    free(text);
    return out;
}

/*
 * Renders the body of a successful create as JSON text (NULL when memory ran out), with the
 * pad_bytes control's "pad" when that body is a 2xx one (the answer, or the task's): an
 * asynchronous personality also makes its task then, when the create makes one.
 */
static char *render_success(struct create_state *cs)
{
    cJSON *doc;
    char *text;

    if (cs->p->async) {
        struct async_create_args a = {
            .p = cs->p,
            .req = cs->req,
            .doc = cs->doc,
            .m = cs->m,
            .ctrl = cs->ctrl,
            .client_ref = cs->rec->client_ref,
            .seq = cs->seq,
            .keep = cs->makes_task,
        };

        doc = async_create(&a, cs->task_id, &cs->events);
    } else {
        char stem[24];

        snprintf(stem, sizeof(stem), "%lu", cs->seq);
        doc = cs->p->render(cs->in, stem);
    }
    text = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    if (text && (cs->ctrl->set & CTRL_PAD) && cs->ctrl->pad_bytes &&
        (cs->status < 300 || cs->makes_task))
        text = add_pad(text, cs->ctrl->pad_bytes);
    return text;
}

/*
 * Fills *reply with the answer to the create: an OpenAI-shaped error for a status of 400
 * or more, the stored body (taken over from *stored) for a replay, else a fresh rendering
 * by the personality.  The rendering is also made for an error status when the create
 * makes its task anyway (task_made): it is then the task's body, not the answer.
 * reply->body stays NULL when memory ran out.
 */
static void build_reply(struct mock_reply *reply, struct create_state *cs, char **stored)
{
    unsigned int status = cs->status;
    char *body = NULL;

    reply_init(reply);
    if (cs->makes_task || (status < 400 && stored == NULL))
        body = render_success(cs);
    if (status >= 400) {
        char message[64], code[32];

        snprintf(message, sizeof(message), "mock status %u", status);
        snprintf(code, sizeof(code), "mock_%u", status);
        reply_set_error(reply, status, message, "mock_error", code);
        cs->task_body_owned = body;
        cs->task_body = body;
    } else if (stored) {
        reply->status = status;
        reply->body = *stored;
        reply->body_len = strlen(*stored);
        reply->replayed = true;
        *stored = NULL;
    } else {
        reply->status = status;
        reply->body = body;
        reply->body_len = body ? strlen(body) : 0;
        cs->task_body = cs->makes_task ? body : NULL;
    }
}

/*
 * Settles the idempotency key this request claimed.  A create that made a task keeps its
 * 2xx body for replays (with the personality's success status when the answer itself was an
 * error: the retry learns of the task the first attempt made); another answer under 400 is
 * kept too; an error that made no task frees the key for a retry.
 */
static void settle_claim(const struct create_state *cs, const char *key, uint64_t token,
                         const struct mock_reply *reply)
{
    const struct mock_personality *p = cs->p;

    if (cs->makes_task && cs->task_body)
        idemkeys_complete(token, p->name, key, cs->task_body,
                          cs->status < 300 ? cs->status : p->create_status);
    else if (reply->status < 400 && reply->body)
        idemkeys_complete(token, p->name, key, reply->body, reply->status);
    else
        idemkeys_release(token, p->name, key);
}

/*
 * Records in the ledger that the create numbered by slot made a task, when it did: a create
 * the provider accepts leaves a task behind even when a fault then loses the answer, and so
 * does one whose error status task_made says came after the task was made; a replay or
 * another status of 300 or more does not.  visible_after_ms hides the task for a while.
 */
static void note_task(const struct ledger_slot *slot, const struct create_state *cs)
{
    unsigned int hidden_ms = (cs->ctrl->set & CTRL_VISIBLE_AFTER) ? cs->ctrl->visible_after_ms : 0;

    if (!cs->makes_task || cs->task_body == NULL)
        return;
    if (!ledger_attach_task(slot, cs->task_id[0] ? cs->task_id : NULL, cs->task_body, hidden_ms))
        fprintf(stderr, "idemgate-mock: task of create %lu not kept (reset or out of memory)\n",
                slot->seq);
}

/*
 * Runs the create pipeline for personality p on a request whose body parsed to doc (NULL
 * when it is not JSON): records it in the ledger and answers it as the controls say.
 * Returns MHD_NO when the connection must be closed.
 */
static enum MHD_Result create(struct mock_request *req, const struct mock_personality *p,
                              const struct route_match *m, const cJSON *doc)
{
    struct ledger_record rec = {0};
    struct mock_controls body_ctrl = {0}, hdr_ctrl = {0}, ctrl;
    struct create_input in;
    struct create_state cs = {0};
    struct mock_reply reply;
    enum idem_claim claim = IDEM_NEW;
    uint64_t token = 0;
    char *stored = NULL;
    unsigned int stored_status = 0, status;
    struct ledger_slot slot = {0};
    char err[FAULTS_ERR_MAX];
    const char *misfit, *auth;
    enum MHD_Result ret;

    rec.route = req->url;
    rec.provider = p->name;
    rec.idempotency_key =
        MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Idempotency-Key");
    read_client_ref(req->conn, doc, &rec);
    mock_sha256_hex(req->body, req->body_len, rec.body_sha256);
    rec.content_type = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Content-Type");
    /* Only a digest of the credential is kept, so a test can tell keys apart without it. */
    auth = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (auth) {
        rec.has_auth = true;
        mock_sha256_hex(auth, strlen(auth), rec.auth_sha256);
    }
    rec.remote_port = remote_port(req->conn);

    /* Malformed requests are still recorded: the ledger shows everything that arrived. */
    if (p->required_header &&
        MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, p->required_header) == NULL)
        return refuse_missing_header(req, &rec, p->required_header);
    if (!cJSON_IsObject(doc))
        return refuse(req, &rec, MHD_HTTP_BAD_REQUEST, "request body must be a JSON object",
                      "invalid_request_error", "invalid_json");
    read_input(doc, &in);
    if ((cJSON_HasObjectItem(doc, "_mock") &&
         !faults_parse_object(cJSON_GetObjectItemCaseSensitive(doc, "_mock"), &body_ctrl, err)) ||
        !faults_parse_headers(req->conn, &hdr_ctrl, err))
        return refuse(req, &rec, MHD_HTTP_BAD_REQUEST, err, "mock_error", "invalid_mock_control");
    misfit = controls_misfit(p, &body_ctrl, &hdr_ctrl);
    if (misfit)
        return refuse(req, &rec, MHD_HTTP_BAD_REQUEST, misfit, "mock_error",
                      "invalid_mock_control");

    if (p->native_idempotency && rec.idempotency_key) {
        claim = idemkeys_claim(p->name, rec.idempotency_key, &token, &stored, &stored_status);
        if (claim == IDEM_ERROR)
            return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                               "oom");
        if (claim == IDEM_IN_FLIGHT) {
            /* A refused duplicate starts no task, which the checker sees as replay=true. */
            rec.replay = true;
            return refuse(req, &rec, MHD_HTTP_CONFLICT,
                          "a request with this Idempotency-Key is still in progress",
                          "idempotency_error", "in_flight");
        }
    }

    /* A status control also overrides a replay, so a test can fail the retry itself. */
    rec.behavior = resolve_controls(&ctrl, &body_ctrl, &hdr_ctrl, p->async != NULL);
    if (ctrl.set & CTRL_N_OUT)
        in.n_out = ctrl.n_out;
    if (ctrl.set & CTRL_STATUS)
        status = ctrl.status;
    else
        status = claim == IDEM_DONE ? stored_status : p->create_status;

    rec.replay = claim == IDEM_DONE;
    rec.fault = ctrl.fault ? ctrl.fault->name : NULL;
    rec.status = ctrl.fault && !ctrl.fault->sends_status ? LEDGER_NO_STATUS : (int)status;
    if (!ledger_append(&rec, &slot)) {
        fprintf(stderr, "idemgate-mock: ledger full or out of memory, refusing create\n");
        if (claim == IDEM_NEW && token)
            idemkeys_release(token, p->name, rec.idempotency_key);
        free(stored);
        return reply_error(req, MHD_HTTP_INSUFFICIENT_STORAGE, "mock ledger is full", "mock_error",
                           "ledger_full");
    }

    cs = (struct create_state){.req = req,
                               .p = p,
                               .m = m,
                               .doc = doc,
                               .in = &in,
                               .ctrl = &ctrl,
                               .rec = &rec,
                               .seq = slot.seq,
                               .status = status,
                               .makes_task = claim != IDEM_DONE &&
                                             ((status >= 200 && status < 300) ||
                                              ((ctrl.set & CTRL_TASK_MADE) && ctrl.task_made))};
    build_reply(&reply, &cs, claim == IDEM_DONE ? &stored : NULL);
    free(stored);
    memcpy(reply.retry_after, ctrl.retry_after, sizeof(reply.retry_after));
    /* The task exists from here on, so a lookup during the delay or a hang finds it. */
    note_task(&slot, &cs);
    /* An early webhook must not be overtaken by the ones the creation sends. */
    if (!(ctrl.webhook.early && cs.task_id[0])) {
        webhooks_enqueue(cs.events);
        cs.events = NULL;
    }

    /*
     * The provider keeps working while the client waits, even when the client gives up,
     * so the delay is not cut short by a disconnect and the key stays in flight meanwhile.
     */
    mock_sleep_ms(req, effective_delay(&ctrl), false);
    if (cs.task_id[0] && ctrl.webhook.early)
        async_finish_early(cs.task_id, cs.events);
    /*
     * Usually the key settles before any fault is delivered, because a transport fault loses
     * the answer, not the task; some providers keep it in flight until the answer is out.
     */
    if (claim == IDEM_NEW && token && !p->in_flight_until_answered)
        settle_claim(&cs, rec.idempotency_key, token, &reply);

    if (reply.body == NULL) {
        ret = MHD_NO;
    } else if (ctrl.fault) {
        req->log_fault = ctrl.fault->name;
        ret = ctrl.fault->deliver(req, &reply);
    } else {
        ret = reply_send(req, &reply);
    }
    if (claim == IDEM_NEW && token && p->in_flight_until_answered)
        settle_claim(&cs, rec.idempotency_key, token, &reply);
    reply_free(&reply);
    free(cs.task_body_owned);
    return ret;
}

/* POST <create route>: parses the body once and runs the create pipeline on it. */
static enum MHD_Result route_create(struct mock_request *req, const struct mock_personality *p,
                                    const struct route_match *m)
{
    const char *ctype = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Content-Type");
    bool form = ctype != NULL && strncasecmp(ctype, "multipart/form-data", 19) == 0;
    /* An upload's text fields stand for the JSON body the rest of the pipeline reads. */
    cJSON *doc = form ? form_fields(ctype, req->body, req->body_len)
                      : cJSON_ParseWithLength(req->body, req->body_len);
    enum MHD_Result ret;

    /* The document lives until the pipeline is done, since the ledger record points into it. */
    ret = create(req, p, m, doc);
    cJSON_Delete(doc);
    return ret;
}

/* GET <lookup route>{ref}: the rest of the path, already URL-decoded, is the reference. */
static enum MHD_Result route_lookup(struct mock_request *req, const struct mock_personality *p,
                                    const struct route_match *m)
{
    const char *ref = route_capture_tail(m, "ref");

    return tasks_handle_lookup(req, p, ref ? ref : "");
}

/* GET <list route>: the recent tasks, in the ledger's shape or the provider's. */
static enum MHD_Result route_list(struct mock_request *req, const struct mock_personality *p,
                                  const struct route_match *m)
{
    if (p->async)
        return async_handle_list(req, p, m);
    return tasks_handle_list(req, p);
}

/* GET <task route>{id}: a synchronous provider's task by its id. */
static enum MHD_Result route_task(struct mock_request *req, const struct mock_personality *p,
                                  const struct route_match *m)
{
    char id[LEDGER_ASYNC_ID_MAX];

    if (!route_capture(m, "id", id, sizeof(id)))
        id[0] = '\0';
    return tasks_handle_read(req, p, id);
}

/* The handler of each route kind, indexed by enum route_kind. */
static enum MHD_Result (*const route_handlers[])(struct mock_request *req,
                                                 const struct mock_personality *p,
                                                 const struct route_match *m) = {
    [ROUTE_CREATE] = route_create,
    [ROUTE_LOOKUP] = route_lookup,
    [ROUTE_LIST] = route_list,
    [ROUTE_TASK] = route_task,
    [ROUTE_POLL] = async_handle_poll,
    [ROUTE_RESULT] = async_handle_result,
    [ROUTE_CANCEL] = async_handle_cancel,
};

/* Returns the personality called name, or NULL when there is none. */
const struct mock_personality *providers_find(const char *name)
{
    for (size_t i = 0; i < sizeof(personality_table) / sizeof(personality_table[0]); i++)
        if (strcmp(personality_table[i].name, name) == 0)
            return &personality_table[i];
    return NULL;
}

/*
 * Handles req when it is for a route of a personality and stores libmicrohttpd's verdict
 * in *ret.  Returns false, leaving req alone, when no personality serves the request's
 * method and path.
 */
bool providers_route(struct mock_request *req, enum MHD_Result *ret)
{
    for (size_t i = 0; i < sizeof(personality_table) / sizeof(personality_table[0]); i++) {
        const struct mock_personality *p = &personality_table[i];

        for (size_t k = 0; k < MOCK_MAX_ROUTES && p->routes[k].pattern; k++) {
            const struct provider_route *r = &p->routes[k];
            struct route_match m;

            if (strcmp(req->method, r->method) == 0 && route_match(r->pattern, req->url, &m)) {
                *ret = route_handlers[r->kind](req, p, &m);
                return true;
            }
        }
    }
    return false;
}
