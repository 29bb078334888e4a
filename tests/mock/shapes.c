/*
 * idemgate-mock: the shapes of the real asynchronous job APIs (see shapes.h).
 *
 * Every renderer runs under the task store's lock, reads the task and returns new cJSON (or
 * fills a reply); NULL means memory ran out.  Objects carry the fields the providers
 * document, in their order, so a profile written against the real API reads them here.
 */
#include "shapes.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Bytes of one URL the renderers build. */
#define URL_MAX 1024

/* ---- Shared helpers ---------------------------------------------------------------- */

/* Adds s to obj under name, or a JSON null when s is NULL. */
static void add_string_or_null(cJSON *obj, const char *name, const char *s)
{
    if (s)
        cJSON_AddStringToObject(obj, name, s);
    else
        cJSON_AddNullToObject(obj, name);
}

/* Adds Unix time t to obj under name as RFC 3339, or a JSON null when t is 0. */
static void add_time_or_null(cJSON *obj, const char *name, double t)
{
    char text[40];

    if (t == 0) {
        cJSON_AddNullToObject(obj, name);
        return;
    }
    async_rfc3339(t, text, sizeof(text));
    cJSON_AddStringToObject(obj, name, text);
}

/* Returns a JSON array of the task's output URLs. */
static cJSON *output_urls(const struct async_task *t)
{
    cJSON *list = cJSON_CreateArray();

    for (unsigned int i = 0; list && i < t->outputs; i++) {
        char url[URL_MAX];

        async_output_url(t, i, url, sizeof(url));
        cJSON_AddItemToArray(list, cJSON_CreateString(url));
    }
    return list;
}

/* The failure message of view v: the task's error, or a fixed word for a cancel. */
static const char *failure_text(const struct async_task *t, struct async_view v)
{
    return v.state == AS_CANCELED ? "canceled" : t->error;
}

/* Fills r with status and doc, JSON. */
static void set_json(struct mock_reply *r, unsigned int status, cJSON *doc)
{
    reply_set_json(r, status, doc);
}

/* Fills r with status and no body (204). */
static void set_empty(struct mock_reply *r, unsigned int status)
{
    r->status = status;
    r->body = NULL;
    r->body_len = 0;
}

/* ---- OpenAI videos ----------------------------------------------------------------- */

static const struct async_step openai_steps[] = {{"queued", false}, {"in_progress", true}};

/* The video object of GET /v1/videos/{id}, also the create's answer and a list item. */
static cJSON *openai_object(const struct async_task *t, struct async_view v)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *err;

    cJSON_AddStringToObject(o, "id", t->id);
    cJSON_AddStringToObject(o, "object", "video");
    cJSON_AddStringToObject(o, "model", "sora-2");
    cJSON_AddStringToObject(o, "status", async_label(t, v));
    cJSON_AddNumberToObject(o, "progress", async_progress(t, v));
    cJSON_AddNumberToObject(o, "created_at", (double)(long long)t->created);
    if (v.state != AS_PENDING && t->completed != 0)
        cJSON_AddNumberToObject(o, "completed_at", (double)(long long)t->completed);
    else
        cJSON_AddNullToObject(o, "completed_at");
    /* The content of a finished video can be downloaded for an hour. */
    if (v.state == AS_SUCCEEDED)
        cJSON_AddNumberToObject(
            o, "expires_at", (double)(long long)(t->completed ? t->completed : t->created) + 3600);
    else
        cJSON_AddNullToObject(o, "expires_at");
    cJSON_AddStringToObject(o, "size", "720x1280");
    cJSON_AddStringToObject(o, "seconds", "4");
    cJSON_AddNullToObject(o, "remixed_from_video_id");
    if (v.state == AS_FAILED || v.state == AS_CANCELED) {
        err = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(err, "code", v.state == AS_FAILED ? "mock_failed" : "canceled");
        cJSON_AddStringToObject(err, "message", failure_text(t, v));
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    if (t->client_ref) {
        cJSON *meta = cJSON_AddObjectToObject(o, "metadata");

        cJSON_AddStringToObject(meta, "client_ref", t->client_ref);
    }
    return o;
}

/* POST /v1/videos answers the video object, queued. */
static cJSON *openai_create(const struct async_task *t)
{
    return openai_object(t, async_current(t));
}

/* OpenAI's webhook event: {"id", "object": "event", "type": "video.<status>", "data"}. */
static cJSON *openai_webhook(const struct async_task *t, struct async_view v, const char *event_id)
{
    static const char *const types[] = {NULL, "video.completed", "video.failed", "video.canceled"};
    cJSON *o = cJSON_CreateObject();
    cJSON *data;
    char type[64];

    if (v.state == AS_PENDING)
        snprintf(type, sizeof(type), "video.%s", async_label(t, v));
    else
        snprintf(type, sizeof(type), "%s", types[v.state]);
    cJSON_AddStringToObject(o, "id", event_id);
    cJSON_AddStringToObject(o, "object", "event");
    cJSON_AddNumberToObject(o, "created_at", (double)time(NULL));
    cJSON_AddStringToObject(o, "type", type);
    data = cJSON_AddObjectToObject(o, "data");
    cJSON_AddStringToObject(data, "id", t->id);
    return o;
}

/* GET /v1/videos/{id}/content: the MP4 once completed, 404 not_ready before. */
static void openai_content(const struct async_task *t, struct mock_reply *r)
{
    if (t->state != AS_SUCCEEDED) {
        reply_set_error(r, 404, "the video is not ready", "invalid_request_error", "not_ready");
        return;
    }
    r->status = 200;
    r->content_type = "video/mp4";
    r->body_len = strlen("MP4:") + strlen(t->id);
    r->body = malloc(r->body_len + 1);
    if (r->body)
        snprintf(r->body, r->body_len + 1, "MP4:%s", t->id);
    else
        r->body_len = 0;
}

/* Adds next_cursor to obj as a string, or a JSON null on the last page. */
static void add_next_cursor(cJSON *obj, const char *next_cursor)
{
    add_string_or_null(obj, "next_cursor", next_cursor);
}

/*
 * GET /v1/videos: {"object": "list", "first_id", "last_id", "has_more", "data",
 * "next_cursor"}.
 */
static cJSON *openai_list(cJSON *items, const char *next_cursor)
{
    cJSON *o = cJSON_CreateObject();
    int n = cJSON_GetArraySize(items);
    const cJSON *first = cJSON_GetArrayItem(items, 0);
    const cJSON *last = cJSON_GetArrayItem(items, n - 1);

    cJSON_AddStringToObject(o, "object", "list");
    add_string_or_null(o, "first_id",
                       first ? cJSON_GetStringValue(cJSON_GetObjectItem(first, "id")) : NULL);
    add_string_or_null(o, "last_id",
                       last ? cJSON_GetStringValue(cJSON_GetObjectItem(last, "id")) : NULL);
    cJSON_AddBoolToObject(o, "has_more", next_cursor != NULL);
    cJSON_AddItemToObject(o, "data", items);
    add_next_cursor(o, next_cursor);
    return o;
}

/* OpenAI's error: {"error": {"message", "type", "code"}}. */
static void openai_error(struct mock_reply *r, unsigned int status, const char *code,
                         const char *message)
{
    reply_set_error(r, status, message, "invalid_request_error", code);
}

const struct async_kind shape_openai_videos = {
    .id_prefix = "video_",
    .steps = openai_steps,
    .n_steps = 2,
    .succeeded = "completed",
    .failed = "failed",
    .canceled = "failed",
    .output_ext = ".mp4",
    /* OpenAI's webhook endpoints are set up in its dashboard: only _mock.webhook.url. */
    .webhooks = true,
    .scheme = WH_STANDARD,
    .events = EV_FINAL,
    .poll_hint_header = "openai-poll-after-ms",
    .poll_hint_value = "100",
    .render_create = openai_create,
    .render_object = openai_object,
    .render_webhook = openai_webhook,
    .render_result = openai_content,
    .render_list = openai_list,
    .render_error = openai_error,
};

/* ---- Replicate --------------------------------------------------------------------- */

static const struct async_step replicate_steps[] = {{"starting", false}, {"processing", true}};

/* The prediction object: the create's answer, GET's, a list item and the webhook body. */
static cJSON *replicate_object(const struct async_task *t, struct async_view v)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *urls;
    char url[URL_MAX];

    cJSON_AddStringToObject(o, "id", t->id);
    add_string_or_null(o, "model", t->scope);
    cJSON_AddStringToObject(o, "version", "mock");
    cJSON_AddItemToObject(o, "input", async_echo(t));
    cJSON_AddStringToObject(o, "logs", "");
    if (v.state == AS_SUCCEEDED)
        cJSON_AddItemToObject(o, "output", output_urls(t));
    else
        cJSON_AddNullToObject(o, "output");
    cJSON_AddFalseToObject(o, "data_removed");
    add_string_or_null(o, "error", v.state == AS_FAILED ? t->error : NULL);
    cJSON_AddStringToObject(o, "status", async_label(t, v));
    add_time_or_null(o, "created_at", t->created);
    add_time_or_null(o, "started_at", async_is_queued(t, v) ? 0 : t->started);
    add_time_or_null(o, "completed_at", v.state == AS_PENDING ? 0 : t->completed);
    urls = cJSON_AddObjectToObject(o, "urls");
    snprintf(url, sizeof(url), "%s/v1/predictions/%s", mock_base_url(), t->id);
    cJSON_AddStringToObject(urls, "get", url);
    snprintf(url, sizeof(url), "%s/v1/predictions/%s/cancel", mock_base_url(), t->id);
    cJSON_AddStringToObject(urls, "cancel", url);
    cJSON_AddObjectToObject(o, "metrics");
    return o;
}

/* POST .../predictions answers 201 with the prediction, starting. */
static cJSON *replicate_create(const struct async_task *t)
{
    return replicate_object(t, async_current(t));
}

/* Replicate's webhook body is the prediction itself. */
static cJSON *replicate_webhook(const struct async_task *t, struct async_view v,
                                const char *event_id)
{
    (void)event_id;
    return replicate_object(t, v);
}

/* POST /v1/predictions/{id}/cancel answers 200 with the prediction. */
static void replicate_cancel(const struct async_task *t, bool was_final, struct mock_reply *r)
{
    (void)was_final;
    set_json(r, 200, async_counted_object(t));
}

/*
 * GET /v1/predictions: {"previous", "next", "results", "has_more", "next_cursor"}, newest
 * first, one page.  "previous" and "next" stay null: the mock's cursor is "next_cursor".
 */
static cJSON *replicate_list(cJSON *items, const char *next_cursor)
{
    cJSON *o = cJSON_CreateObject();

    cJSON_AddNullToObject(o, "previous");
    cJSON_AddNullToObject(o, "next");
    cJSON_AddItemToObject(o, "results", items);
    cJSON_AddBoolToObject(o, "has_more", next_cursor != NULL);
    add_next_cursor(o, next_cursor);
    return o;
}

/* Replicate's error: {"title", "detail", "status"}. */
static void replicate_error(struct mock_reply *r, unsigned int status, const char *code,
                            const char *message)
{
    cJSON *o = cJSON_CreateObject();

    cJSON_AddStringToObject(o, "title", strcmp(code, "not_found") == 0 ? "Not found" : code);
    cJSON_AddStringToObject(o, "detail", message);
    cJSON_AddNumberToObject(o, "status", status);
    set_json(r, status, o);
}

const struct async_kind shape_replicate = {
    .id_prefix = "p",
    .steps = replicate_steps,
    .n_steps = 2,
    .succeeded = "succeeded",
    .failed = "failed",
    .canceled = "canceled",
    .scope_template = "{owner}/{name}",
    .output_ext = ".png",
    .echo_member = "input",
    .webhooks = true,
    .scheme = WH_STANDARD,
    .webhook_member = "webhook",
    .events = EV_FINAL,
    .events_filter = true,
    .render_create = replicate_create,
    .render_object = replicate_object,
    .render_webhook = replicate_webhook,
    .render_cancel = replicate_cancel,
    .render_list = replicate_list,
    .render_error = replicate_error,
};

/* ---- fal queue --------------------------------------------------------------------- */

static const struct async_step fal_steps[] = {{"IN_QUEUE", false}, {"IN_PROGRESS", true}};

/* Writes "<base>/fal/<model>/requests/<id><suffix>" into out. */
static void fal_url(const struct async_task *t, const char *suffix, char *out, size_t size)
{
    snprintf(out, size, "%s/fal/%s/requests/%s%s", mock_base_url(), t->scope ? t->scope : "", t->id,
             suffix);
}

/* POST /fal/{model}: {"request_id", "status_url", "response_url", "cancel_url"}. */
static cJSON *fal_create(const struct async_task *t)
{
    cJSON *o = cJSON_CreateObject();
    char url[URL_MAX];

    cJSON_AddStringToObject(o, "request_id", t->id);
    fal_url(t, "/status", url, sizeof(url));
    cJSON_AddStringToObject(o, "status_url", url);
    fal_url(t, "", url, sizeof(url));
    cJSON_AddStringToObject(o, "response_url", url);
    fal_url(t, "/cancel", url, sizeof(url));
    cJSON_AddStringToObject(o, "cancel_url", url);
    return o;
}

/* GET .../status: {"status", "request_id", "response_url", "queue_position" while queued}. */
static cJSON *fal_status(const struct async_task *t, struct async_view v)
{
    cJSON *o = cJSON_CreateObject();
    char url[URL_MAX];

    cJSON_AddStringToObject(o, "status", async_label(t, v));
    cJSON_AddStringToObject(o, "request_id", t->id);
    fal_url(t, "", url, sizeof(url));
    cJSON_AddStringToObject(o, "response_url", url);
    if (async_is_queued(t, v))
        cJSON_AddNumberToObject(o, "queue_position", 0);
    return o;
}

/* The result of a successful request: {"images": [{"url", "content_type", ...}], "seed"}. */
static cJSON *fal_result_doc(const struct async_task *t)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *images = cJSON_AddArrayToObject(o, "images");

    for (unsigned int i = 0; images && i < t->outputs; i++) {
        cJSON *img = cJSON_CreateObject();
        char url[URL_MAX];

        async_output_url(t, i, url, sizeof(url));
        cJSON_AddStringToObject(img, "url", url);
        cJSON_AddStringToObject(img, "content_type", "image/png");
        cJSON_AddNumberToObject(img, "width", 1024);
        cJSON_AddNumberToObject(img, "height", 1024);
        cJSON_AddItemToArray(images, img);
    }
    cJSON_AddNumberToObject(o, "seed", 1);
    return o;
}

/* A failed request's error, FastAPI style: {"detail": [{"loc", "msg", "type"}]}. */
static cJSON *fal_error_doc(const char *message, const char *type)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *detail = cJSON_AddArrayToObject(o, "detail");
    cJSON *item = cJSON_CreateObject();
    cJSON *loc = cJSON_AddArrayToObject(item, "loc");

    cJSON_AddItemToArray(loc, cJSON_CreateString("body"));
    cJSON_AddStringToObject(item, "msg", message);
    cJSON_AddStringToObject(item, "type", type);
    cJSON_AddItemToArray(detail, item);
    return o;
}

/* GET .../requests/{id}: 200 result, 422 error, 400 while in progress. */
static void fal_result(const struct async_task *t, struct mock_reply *r)
{
    cJSON *o;

    switch (t->state) {
    case AS_SUCCEEDED:
        set_json(r, 200, fal_result_doc(t));
        return;
    case AS_FAILED:
        set_json(r, 422, fal_error_doc(t->error, "mock_failed"));
        return;
    case AS_CANCELED:
        set_json(r, 422, fal_error_doc("Request was cancelled", "request_cancelled"));
        return;
    case AS_PENDING:
        break;
    }
    o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "detail", "Request is still in progress");
    set_json(r, 400, o);
}

/* fal's webhook: {"request_id", "gateway_request_id", "status": OK|ERROR, "payload", "error"}. */
static cJSON *fal_webhook(const struct async_task *t, struct async_view v, const char *event_id)
{
    cJSON *o = cJSON_CreateObject();

    (void)event_id;
    cJSON_AddStringToObject(o, "request_id", t->id);
    cJSON_AddStringToObject(o, "gateway_request_id", t->id);
    if (v.state == AS_SUCCEEDED) {
        cJSON_AddStringToObject(o, "status", "OK");
        cJSON_AddItemToObject(o, "payload", fal_result_doc(t));
        cJSON_AddNullToObject(o, "error");
    } else if (v.state != AS_PENDING) {
        cJSON_AddStringToObject(o, "status", "ERROR");
        cJSON_AddItemToObject(o, "payload", fal_error_doc(failure_text(t, v), "mock_failed"));
        cJSON_AddStringToObject(o, "error", failure_text(t, v));
    } else {
        /* fal sends no progress webhooks; a stale one (reorder) reports the queue status. */
        cJSON_AddStringToObject(o, "status", async_label(t, v));
        cJSON_AddNullToObject(o, "payload");
        cJSON_AddNullToObject(o, "error");
    }
    return o;
}

/* PUT .../cancel: 202 CANCELLATION_REQUESTED, or 400 ALREADY_COMPLETED once it has ended. */
static void fal_cancel(const struct async_task *t, bool was_final, struct mock_reply *r)
{
    cJSON *o = cJSON_CreateObject();

    (void)t;
    cJSON_AddStringToObject(o, "status",
                            was_final ? "ALREADY_COMPLETED" : "CANCELLATION_REQUESTED");
    set_json(r, was_final ? 400 : 202, o);
}

/* fal's error: {"detail": message}. */
static void fal_error(struct mock_reply *r, unsigned int status, const char *code,
                      const char *message)
{
    cJSON *o = cJSON_CreateObject();

    (void)code;
    cJSON_AddStringToObject(o, "detail", message);
    set_json(r, status, o);
}

const struct async_kind shape_fal = {
    .id_prefix = "req_",
    .steps = fal_steps,
    .n_steps = 2,
    /* fal reports every ending as COMPLETED; the outcome shows on the response. */
    .succeeded = "COMPLETED",
    .failed = "COMPLETED",
    .canceled = "COMPLETED",
    .scope_template = "{model}",
    .scope_segments = 2, /* the request URLs name the app: fal-ai/flux, not fal-ai/flux/dev */
    .output_ext = ".png",
    .webhooks = true,
    .scheme = WH_FAL_ED25519,
    .webhook_query = "fal_webhook",
    .events = EV_FINAL,
    .render_create = fal_create,
    .render_object = fal_status,
    .render_webhook = fal_webhook,
    .render_result = fal_result,
    .render_cancel = fal_cancel,
    .render_error = fal_error,
};

/* ---- Runway ------------------------------------------------------------------------ */

static const struct async_step runway_steps[] = {
    {"PENDING", false}, {"THROTTLED", false}, {"RUNNING", true}};

/* POST /v1/image_to_video (and text_to_image): {"id"}. */
static cJSON *runway_create(const struct async_task *t)
{
    cJSON *o = cJSON_CreateObject();

    cJSON_AddStringToObject(o, "id", t->id);
    return o;
}

/* GET /v1/tasks/{id}: {"id", "status", "createdAt", progress/output/failure as they apply}. */
static cJSON *runway_object(const struct async_task *t, struct async_view v)
{
    cJSON *o = cJSON_CreateObject();

    cJSON_AddStringToObject(o, "id", t->id);
    cJSON_AddStringToObject(o, "status", async_label(t, v));
    add_time_or_null(o, "createdAt", t->created);
    if (v.state == AS_PENDING && !async_is_queued(t, v))
        cJSON_AddNumberToObject(o, "progress", async_progress(t, v) / 100.0);
    if (v.state == AS_SUCCEEDED)
        cJSON_AddItemToObject(o, "output", output_urls(t));
    if (v.state == AS_FAILED) {
        cJSON_AddStringToObject(o, "failure", t->error);
        cJSON_AddStringToObject(o, "failureCode", "MOCK.FAILED");
    }
    return o;
}

/* DELETE /v1/tasks/{id}: 204 whether or not the task had ended. */
static void runway_cancel(const struct async_task *t, bool was_final, struct mock_reply *r)
{
    (void)t;
    (void)was_final;
    set_empty(r, 204);
}

/* Runway's error: {"error": message}. */
static void runway_error(struct mock_reply *r, unsigned int status, const char *code,
                         const char *message)
{
    cJSON *o = cJSON_CreateObject();

    (void)code;
    cJSON_AddStringToObject(o, "error", message);
    set_json(r, status, o);
}

const struct async_kind shape_runway = {
    .steps = runway_steps,
    .n_steps = 3,
    .succeeded = "SUCCEEDED",
    .failed = "FAILED",
    .canceled = "CANCELLED",
    .render_create = runway_create,
    .render_object = runway_object,
    .render_cancel = runway_cancel,
    .render_error = runway_error,
};

/* ---- Luma -------------------------------------------------------------------------- */

static const struct async_step luma_steps[] = {{"queued", false}, {"dreaming", true}};

/* The generation object: the create's answer, GET's, a list item and the callback body. */
static cJSON *luma_object(const struct async_task *t, struct async_view v)
{
    cJSON *o = cJSON_CreateObject();

    cJSON_AddStringToObject(o, "id", t->id);
    cJSON_AddStringToObject(o, "generation_type", "video");
    cJSON_AddStringToObject(o, "state", async_label(t, v));
    add_string_or_null(o, "failure_reason",
                       v.state == AS_FAILED || v.state == AS_CANCELED ? failure_text(t, v) : NULL);
    add_time_or_null(o, "created_at", t->created);
    if (v.state == AS_SUCCEEDED) {
        cJSON *assets = cJSON_AddObjectToObject(o, "assets");
        char url[URL_MAX];

        async_output_url(t, 0, url, sizeof(url));
        cJSON_AddStringToObject(assets, "video", url);
    } else {
        cJSON_AddNullToObject(o, "assets");
    }
    cJSON_AddStringToObject(o, "model", "ray-2");
    cJSON_AddItemToObject(o, "request", async_echo(t));
    return o;
}

/* POST /dream-machine/v1/generations answers 201 with the generation, queued. */
static cJSON *luma_create(const struct async_task *t)
{
    return luma_object(t, async_current(t));
}

/* Luma's callback body is the generation itself. */
static cJSON *luma_webhook(const struct async_task *t, struct async_view v, const char *event_id)
{
    (void)event_id;
    return luma_object(t, v);
}

/* DELETE .../generations/{id}: 204; the generation is gone afterwards. */
static void luma_cancel(const struct async_task *t, bool was_final, struct mock_reply *r)
{
    (void)t;
    (void)was_final;
    set_empty(r, 204);
}

/* GET /dream-machine/v1/generations: {"has_more", "count", "generations", "next_cursor"}. */
static cJSON *luma_list(cJSON *items, const char *next_cursor)
{
    cJSON *o = cJSON_CreateObject();

    cJSON_AddBoolToObject(o, "has_more", next_cursor != NULL);
    cJSON_AddNumberToObject(o, "count", cJSON_GetArraySize(items));
    cJSON_AddItemToObject(o, "generations", items);
    add_next_cursor(o, next_cursor);
    return o;
}

/* Luma's error: {"detail": message}. */
static void luma_error(struct mock_reply *r, unsigned int status, const char *code,
                       const char *message)
{
    fal_error(r, status, code, message);
}

const struct async_kind shape_luma = {
    .steps = luma_steps,
    .n_steps = 2,
    .succeeded = "completed",
    .failed = "failed",
    .canceled = "failed",
    .output_ext = ".mp4",
    .echo_member = "",
    .webhooks = true,
    .scheme = WH_UNSIGNED,
    .webhook_member = "callback_url",
    .events = EV_CREATED | EV_STEP | EV_FINAL,
    .cancel_deletes = true,
    .render_create = luma_create,
    .render_object = luma_object,
    .render_webhook = luma_webhook,
    .render_cancel = luma_cancel,
    .render_list = luma_list,
    .render_error = luma_error,
};

/* ---- Vertex AI Veo ----------------------------------------------------------------- */

static const struct async_step vertex_steps[] = {{"pending", false}, {"running", true}};

/* :predictLongRunning answers {"name": "projects/.../operations/op<n>"}. */
static cJSON *vertex_create(const struct async_task *t)
{
    cJSON *o = cJSON_CreateObject();

    cJSON_AddStringToObject(o, "name", t->id);
    return o;
}

/* :fetchPredictOperation: {"name", "done"} and, once done, "response" or "error". */
static cJSON *vertex_object(const struct async_task *t, struct async_view v)
{
    cJSON *o = cJSON_CreateObject();

    cJSON_AddStringToObject(o, "name", t->id);
    cJSON_AddBoolToObject(o, "done", v.state != AS_PENDING);
    if (v.state == AS_SUCCEEDED) {
        cJSON *resp = cJSON_AddObjectToObject(o, "response");
        cJSON *videos;

        cJSON_AddStringToObject(resp, "@type",
                                "type.googleapis.com/cloud.ai.large_models.vision."
                                "GenerateVideoResponse");
        /* Videos its safety filter withheld are counted, with a reason each, not returned. */
        cJSON_AddNumberToObject(resp, "raiMediaFilteredCount", t->filtered);
        if (t->filtered) {
            cJSON *why = cJSON_AddArrayToObject(resp, "raiMediaFilteredReasons");
            for (unsigned int i = 0; why && i < t->filtered; i++)
                cJSON_AddItemToArray(why, cJSON_CreateString("the mock's filter"));
        }
        videos = cJSON_AddArrayToObject(resp, "videos");
        for (unsigned int i = 0; videos && i < t->outputs; i++) {
            cJSON *video = cJSON_CreateObject();
            char uri[URL_MAX];

            /* Without a storageUri Veo answers the bytes inline (bytesBase64Encoded): the
             * bytes /files/ serves for this output. */
            char body[URL_MAX + 8], b64[2 * URL_MAX];
            int len;
            snprintf(uri, sizeof(uri), "%s-%u.mp4", t->short_id, i);
            len = snprintf(body, sizeof(body), "MP4:%s", uri);
            EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)body, len);
            cJSON_AddStringToObject(video, "bytesBase64Encoded", b64);
            cJSON_AddStringToObject(video, "mimeType", "video/mp4");
            cJSON_AddItemToArray(videos, video);
        }
    } else if (v.state != AS_PENDING) {
        cJSON *err = cJSON_AddObjectToObject(o, "error");

        /* google.rpc.Code: 3 INVALID_ARGUMENT for a failed generation, 1 CANCELLED. */
        cJSON_AddNumberToObject(err, "code", v.state == AS_FAILED ? 3 : 1);
        cJSON_AddStringToObject(err, "message", failure_text(t, v));
    }
    return o;
}

/* Google's error: {"error": {"code", "message", "status"}}. */
static void vertex_error(struct mock_reply *r, unsigned int status, const char *code,
                         const char *message)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(o, "error");

    (void)code;
    cJSON_AddNumberToObject(err, "code", status);
    cJSON_AddStringToObject(err, "message", message);
    cJSON_AddStringToObject(err, "status", status == 404 ? "NOT_FOUND" : "INVALID_ARGUMENT");
    set_json(r, status, o);
}

const struct async_kind shape_vertex = {
    .id_prefix = "op",
    .operation_names = true,
    .steps = vertex_steps,
    .n_steps = 2,
    .succeeded = "done",
    .failed = "done",
    .canceled = "done",
    .scope_template = "projects/{p}/locations/{l}/publishers/google/models/{m}",
    .id_body_member = "operationName",
    .output_ext = ".mp4",
    .render_create = vertex_create,
    .render_object = vertex_object,
    .render_error = vertex_error,
};

/* ---- Keyed async (Higgsfield / Argil style) ---------------------------------------- */

static const struct async_step keyed_steps[] = {{"queued", false}, {"in_progress", true}};

/* Adds the keyed task's id: a string, or a JSON integer for a numeric id (exact digits). */
static void keyed_add_id(cJSON *o, const struct async_task *t)
{
    if (t->id_numeric)
        cJSON_AddRawToObject(o, "id", t->id);
    else
        cJSON_AddStringToObject(o, "id", t->id);
}

/* POST /v1/keyed/generations answers 202 {"id", "status": "queued"} ("id" left out: id_missing). */
static cJSON *keyed_create(const struct async_task *t)
{
    cJSON *o = cJSON_CreateObject();

    if (!t->id_missing)
        keyed_add_id(o, t);
    cJSON_AddStringToObject(o, "status", async_label(t, async_current(t)));
    return o;
}

/*
 * GET /v1/keyed/generations/{id}: {"id", "status", "outputs", "error", "created_at",
 * "metadata": {"client_ref"}}.
 */
static cJSON *keyed_object(const struct async_task *t, struct async_view v)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *outputs, *metadata;

    keyed_add_id(o, t);
    cJSON_AddStringToObject(o, "status", async_label(t, v));
    outputs = cJSON_AddArrayToObject(o, "outputs");
    for (unsigned int i = 0; outputs && v.state == AS_SUCCEEDED && i < t->outputs; i++) {
        cJSON *item = cJSON_CreateObject();
        char url[URL_MAX];

        async_output_url(t, i, url, sizeof(url));
        cJSON_AddStringToObject(item, "url", url);
        cJSON_AddItemToArray(outputs, item);
    }
    if (v.state == AS_FAILED || v.state == AS_CANCELED) {
        cJSON *err = cJSON_AddObjectToObject(o, "error");

        cJSON_AddStringToObject(err, "message", failure_text(t, v));
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    add_time_or_null(o, "created_at", t->created);
    metadata = cJSON_AddObjectToObject(o, "metadata");
    if (metadata)
        add_string_or_null(metadata, "client_ref", t->client_ref);
    return o;
}

/* The keyed provider's webhook body is the generation itself. */
static cJSON *keyed_webhook(const struct async_task *t, struct async_view v, const char *event_id)
{
    (void)event_id;
    return keyed_object(t, v);
}

/* The keyed provider's error: {"error": {"code", "message"}}. */
static void keyed_error(struct mock_reply *r, unsigned int status, const char *code,
                        const char *message)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(o, "error");

    cJSON_AddStringToObject(err, "code", code);
    cJSON_AddStringToObject(err, "message", message);
    set_json(r, status, o);
}

const struct async_kind shape_keyed = {
    .id_prefix = "gen_",
    .id_controls = true,
    .steps = keyed_steps,
    .n_steps = 2,
    .succeeded = "completed",
    .failed = "failed",
    .canceled = "canceled",
    .output_ext = ".png",
    .webhooks = true,
    .scheme = WH_HMAC_HEX,
    .webhook_member = "webhook_url",
    .events = EV_FINAL,
    .render_create = keyed_create,
    .render_object = keyed_object,
    .render_webhook = keyed_webhook,
    .render_error = keyed_error,
};
