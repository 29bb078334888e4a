/*
 * idemgate-mock: the provider's task endpoints, which the gateway reconciles against
 * (see tasks.h).
 */
#include "tasks.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "async.h"
#include "chaos.h"
#include "ledger.h"
#include "reply.h"

/* Tasks a list answers when the request does not say, and the most it may ask for. */
#define LIST_LIMIT_DEFAULT 100
#define LIST_LIMIT_MAX 1000

/* Largest since/until accepted: far beyond any real clock, small enough for a double. */
#define UNIX_SECONDS_MAX 1000000000000000LL

/* ---- Settings (/_config) ----------------------------------------------------------- */

/* The settings, in the order of config_table. */
enum config_id {
    CFG_LOOKUP,
    CFG_LIST,
    CFG_LOOKUP_STATUS,
    CFG_LIST_STATUS,
    CFG_LIST_PAGE_MAX,
    CFG_LIST_PAGE_STATUS,
    CFG_LOOKUP_DELAY_MS,
    CFG_LIST_ENVELOPE,
    CFG_COUNT,
};

/* What kind of value a setting takes. */
enum config_kind {
    CFG_SWITCH, /* an on/off switch: a JSON boolean */
    CFG_STATUS, /* an error status: 0 (none) or 400..599 */
    CFG_NUMBER, /* an integer within [min, max] */
};

/* One /_config setting. */
struct config_field {
    const char *name;
    enum config_kind kind;
    unsigned int initial;  /* at start and after /_reset */
    unsigned int min, max; /* the bounds of a CFG_NUMBER */
};

/* Every setting; a new one is one more row and one more enum config_id. */
static const struct config_field config_table[CFG_COUNT] = {
    /* The lookup endpoint exists. */
    [CFG_LOOKUP] = {"lookup", CFG_SWITCH, 1, 0, 1},
    /* The list endpoints exist. */
    [CFG_LIST] = {"list", CFG_SWITCH, 1, 0, 1},
    /* The lookup fails with this status. */
    [CFG_LOOKUP_STATUS] = {"lookup_status", CFG_STATUS, 0, 0, 0},
    /* The lists fail with this status. */
    [CFG_LIST_STATUS] = {"list_status", CFG_STATUS, 0, 0, 0},
    /* The most tasks one list page holds, whatever "limit" asks for. */
    [CFG_LIST_PAGE_MAX] = {"list_page_max", CFG_NUMBER, LIST_LIMIT_MAX, 1, LIST_LIMIT_MAX},
    /* A list request that carries a cursor (a page after the first) fails with this status. */
    [CFG_LIST_PAGE_STATUS] = {"list_page_status", CFG_STATUS, 0, 0, 0},
    /* Every lookup and list page waits this long before it answers (a slow search). */
    [CFG_LOOKUP_DELAY_MS] = {"lookup_delay_ms", CFG_NUMBER, 0, 0, 600000},
    /* The lists answer 200 with an error envelope and no list (a proxy's or a changed API's
     * answer): a page that holds no list, which proves nothing. */
    [CFG_LIST_ENVELOPE] = {"list_envelope", CFG_SWITCH, 0, 0, 1},
};

static pthread_mutex_t config_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int config_values[CFG_COUNT];

/* Returns the current value of setting id. */
static unsigned int config_get(enum config_id id)
{
    unsigned int v;

    pthread_mutex_lock(&config_lock);
    v = config_values[id];
    pthread_mutex_unlock(&config_lock);
    return v;
}

/*
 * Parses the JSON value v of setting f into *out.  Returns false and says why in err
 * (TASKS_ERR_MAX bytes) when v does not fit the setting.
 */
static bool config_parse(const struct config_field *f, const cJSON *v, unsigned int *out, char *err)
{
    if (f->kind == CFG_NUMBER) {
        if (cJSON_IsNumber(v) && v->valuedouble >= f->min && v->valuedouble <= f->max &&
            v->valuedouble == (unsigned int)v->valuedouble) {
            *out = (unsigned int)v->valuedouble;
            return true;
        }
        snprintf(err, TASKS_ERR_MAX, "%s must be an integer %u..%u", f->name, f->min, f->max);
        return false;
    }
    if (f->kind == CFG_SWITCH) {
        if (cJSON_IsBool(v)) {
            *out = cJSON_IsTrue(v) ? 1 : 0;
            return true;
        }
        snprintf(err, TASKS_ERR_MAX, "%s must be true or false", f->name);
        return false;
    }
    /* A success status would make a failing endpoint look healthy, so only errors are taken. */
    if (cJSON_IsNumber(v) &&
        (v->valuedouble == 0 || (v->valuedouble >= 400 && v->valuedouble <= 599 &&
                                 v->valuedouble == (int)v->valuedouble))) {
        *out = (unsigned int)v->valuedouble;
        return true;
    }
    snprintf(err, TASKS_ERR_MAX, "%s must be 0 or an integer 400..599", f->name);
    return false;
}

/*
 * Applies a /_config document such as {"lookup": false, "list_status": 503}, all of it or,
 * when a key is unknown or a value invalid, none of it; err (TASKS_ERR_MAX bytes) then
 * says why and false is returned.
 */
bool tasks_config_apply(const cJSON *doc, char *err)
{
    unsigned int staged[CFG_COUNT];
    bool set[CFG_COUNT] = {false};
    const cJSON *item;

    if (!cJSON_IsObject(doc)) {
        snprintf(err, TASKS_ERR_MAX, "the body must be a JSON object");
        return false;
    }
    cJSON_ArrayForEach(item, doc)
    {
        size_t id = 0;

        while (id < CFG_COUNT && strcmp(config_table[id].name, item->string) != 0)
            id++;
        /* Unknown keys are refused so that a misspelt setting fails loudly in a test. */
        if (id == CFG_COUNT) {
            snprintf(err, TASKS_ERR_MAX, "unknown setting \"%.60s\"", item->string);
            return false;
        }
        if (!config_parse(&config_table[id], item, &staged[id], err))
            return false;
        set[id] = true;
    }
    pthread_mutex_lock(&config_lock);
    for (size_t id = 0; id < CFG_COUNT; id++)
        if (set[id])
            config_values[id] = staged[id];
    pthread_mutex_unlock(&config_lock);
    return true;
}

/* Returns every setting as a JSON object, or NULL when memory ran out. */
cJSON *tasks_config_to_json(void)
{
    unsigned int values[CFG_COUNT];
    cJSON *doc = cJSON_CreateObject();

    if (doc == NULL)
        return NULL;
    pthread_mutex_lock(&config_lock);
    memcpy(values, config_values, sizeof(values));
    pthread_mutex_unlock(&config_lock);
    for (size_t id = 0; id < CFG_COUNT; id++) {
        const struct config_field *f = &config_table[id];
        cJSON *v = f->kind == CFG_SWITCH ? cJSON_CreateBool(values[id] != 0)
                                         : cJSON_CreateNumber((double)values[id]);

        if (v == NULL || !cJSON_AddItemToObject(doc, f->name, v)) {
            cJSON_Delete(v);
            cJSON_Delete(doc);
            return NULL;
        }
    }
    return doc;
}

/* Restores every setting to its initial value; main() calls it once before serving. */
void tasks_config_reset(void)
{
    pthread_mutex_lock(&config_lock);
    for (size_t id = 0; id < CFG_COUNT; id++)
        config_values[id] = config_table[id].initial;
    pthread_mutex_unlock(&config_lock);
}

/* ---- Unrelated tasks (POST /_tasks/seed) ------------------------------------------- */

/* Most tasks one seed request makes. */
#define SEED_MAX 100000u

/* The number of the last seeded task since the start or the last reset. */
static pthread_mutex_t seed_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long seed_counter;

/* Restores the settings and restarts the numbering of seeded tasks (POST /_reset). */
void tasks_reset(void)
{
    tasks_config_reset();
    pthread_mutex_lock(&seed_lock);
    seed_counter = 0;
    pthread_mutex_unlock(&seed_lock);
}

/*
 * Makes seeded task number n of personality p, with the client reference "other-<n>", and
 * writes its id into id (LEDGER_ASYNC_ID_MAX).  A synchronous personality's task is
 * "task_s<n>" in the ledger's task store; an asynchronous one's is a task of its own
 * store with the provider's usual id.  Returns false when the store is full or memory ran
 * out.
 */
static bool seed_one(const struct mock_personality *p, unsigned long n, char *ref, char *id)
{
    struct create_input in = {.prompt_len = 0, .n = 1, .n_out = 1};
    char stem[24];
    cJSON *doc;
    char *body;
    bool ok;

    snprintf(ref, 32, "other-%lu", n);
    if (p->async)
        return async_seed(p, ref, id);
    snprintf(stem, sizeof(stem), "s%lu", n);
    snprintf(id, LEDGER_ASYNC_ID_MAX, "task_%s", stem);
    doc = p->render(&in, stem);
    body = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    ok = body && ledger_seed_task(p->name, id, ref, body);
    free(body);
    return ok;
}

/*
 * POST /_tasks/seed {"provider": NAME, "count": N}: makes N tasks of that personality that
 * no create made, created now, with the client references "other-<n>" (n counts on from
 * the last seeded task), and answers {"provider", "count", "tasks": [{"id", "client_ref"},
 * ...]} in the order they were made.  They show in lookups, lists and /_tasks, never in
 * /_ledger.
 */
enum MHD_Result tasks_handle_seed(struct mock_request *req)
{
    cJSON *doc = cJSON_ParseWithLength(req->body, req->body_len);
    const cJSON *provider = cJSON_GetObjectItemCaseSensitive(doc, "provider");
    const cJSON *count = cJSON_GetObjectItemCaseSensitive(doc, "count");
    const struct mock_personality *p = NULL;
    const char *problem = NULL;
    const cJSON *item;
    unsigned long first = 0, n = 0;
    cJSON *out = NULL, *list = NULL;

    if (!cJSON_IsObject(doc))
        problem = "the body must be {\"provider\": NAME, \"count\": N}";
    else
        cJSON_ArrayForEach(item, doc)
        {
            if (strcmp(item->string, "provider") != 0 && strcmp(item->string, "count") != 0)
                problem = "unknown key: provider and count are known";
        }
    if (!problem &&
        (!cJSON_IsString(provider) || (p = providers_find(provider->valuestring)) == NULL))
        problem = "provider must name a personality (openai-images, replicate, ...)";
    if (!problem &&
        (!cJSON_IsNumber(count) || count->valuedouble < 1 || count->valuedouble > SEED_MAX ||
         count->valuedouble != (double)(unsigned long)count->valuedouble))
        problem = "count must be an integer 1..100000";
    if (problem) {
        cJSON_Delete(doc);
        return reply_error(req, MHD_HTTP_BAD_REQUEST, problem, "mock_error", "invalid_seed");
    }
    n = (unsigned long)count->valuedouble;
    cJSON_Delete(doc);

    pthread_mutex_lock(&seed_lock);
    first = seed_counter + 1;
    seed_counter += n;
    pthread_mutex_unlock(&seed_lock);

    out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "provider", p->name);
    cJSON_AddNumberToObject(out, "count", (double)n);
    list = cJSON_AddArrayToObject(out, "tasks");
    for (unsigned long k = 0; list && k < n; k++) {
        char ref[32], id[LEDGER_ASYNC_ID_MAX];
        cJSON *t;

        if (!seed_one(p, first + k, ref, id)) {
            cJSON_Delete(out);
            return reply_error(req, MHD_HTTP_INSUFFICIENT_STORAGE,
                               "the task store is full or memory ran out", "mock_error",
                               "store_full");
        }
        t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "id", id);
        cJSON_AddStringToObject(t, "client_ref", ref);
        cJSON_AddItemToArray(list, t);
    }
    if (list == NULL) {
        cJSON_Delete(out);
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    }
    return reply_json(req, MHD_HTTP_OK, out);
}

/* ---- Endpoints --------------------------------------------------------------------- */

/* The two settings that govern one task endpoint. */
struct endpoint_gate {
    enum config_id exists; /* off: the provider has no such endpoint */
    enum config_id status; /* non-zero: the endpoint fails with this status */
};

static const struct endpoint_gate lookup_gate = {CFG_LOOKUP, CFG_LOOKUP_STATUS};
static const struct endpoint_gate list_gate = {CFG_LIST, CFG_LIST_STATUS};

/*
 * Answers the request in *ret and returns true when the settings say the endpoint is
 * missing (404 no_such_endpoint, which the lookup's own 404 not_found is told apart from)
 * or failing (its status, with the same error body as a create's status control).
 */
static bool gate_closed(struct mock_request *req, const struct endpoint_gate *g,
                        enum MHD_Result *ret)
{
    unsigned int status = config_get(g->status);
    char message[64], code[32];

    if (!config_get(g->exists)) {
        *ret = reply_error(req, MHD_HTTP_NOT_FOUND, "this provider has no such endpoint",
                           "invalid_request_error", "no_such_endpoint");
        return true;
    }
    if (status == 0)
        return false;
    snprintf(message, sizeof(message), "mock status %u", status);
    snprintf(code, sizeof(code), "mock_%u", status);
    *ret = reply_error(req, status, message, "mock_error", code);
    return true;
}

/*
 * Builds the task object {"id", "object", "client_ref", "created", "status", "result"}, or
 * returns NULL when memory ran out.  The result is the create's body, embedded verbatim.
 */
static cJSON *task_to_json(const struct ledger_task *t)
{
    cJSON *obj = cJSON_CreateObject();
    bool ok;

    if (obj == NULL)
        return NULL;
    ok =
        cJSON_AddStringToObject(obj, "id", t->id) && cJSON_AddStringToObject(obj, "object", "task");
    if (ok && t->client_ref)
        ok = cJSON_AddStringToObject(obj, "client_ref", t->client_ref) != NULL;
    else if (ok)
        ok = cJSON_AddNullToObject(obj, "client_ref") != NULL;
    /* Every task the mock makes finishes with its create, so there is no pending state. */
    ok = ok && cJSON_AddNumberToObject(obj, "created", t->created) &&
         cJSON_AddStringToObject(obj, "status", "succeeded") &&
         cJSON_AddRawToObject(obj, "result", t->result);
    if (!ok) {
        cJSON_Delete(obj);
        return NULL;
    }
    return obj;
}

/* What collect_task() gathers: the task objects, and the position of the last one. */
struct collected {
    cJSON *data;
    unsigned long last_pos;
};

/* ledger_each_task() visitor: appends the task object of t to the struct collected ctx. */
static bool collect_task(const struct ledger_task *t, void *ctx)
{
    struct collected *c = ctx;
    cJSON *item = task_to_json(t);

    if (item == NULL)
        return false;
    if (!cJSON_AddItemToArray(c->data, item)) {
        cJSON_Delete(item);
        return false;
    }
    c->last_pos = t->pos;
    return true;
}

/*
 * Fills c->data, a cJSON array, with the task objects q selects, newest first, and sets
 * *more (may be NULL) when the limit left some out.  Returns false when memory ran out.
 */
static bool collect_tasks(const struct ledger_task_query *q, struct collected *c, bool *more)
{
    return c->data != NULL && ledger_each_task(q, collect_task, c, more);
}

/*
 * Sends {"object": "list", "data": data} with status 200, taking data over.  A page of a
 * list route (next_cursor not NULL) also has "has_more" and "next_cursor", an empty string
 * meaning null: the last page.
 */
static enum MHD_Result reply_list(struct mock_request *req, cJSON *data, const char *next_cursor)
{
    cJSON *doc = cJSON_CreateObject();
    bool ok = doc != NULL && cJSON_AddStringToObject(doc, "object", "list") &&
              cJSON_AddItemToObject(doc, "data", data);

    if (!ok)
        cJSON_Delete(data);
    if (ok && next_cursor)
        ok = cJSON_AddBoolToObject(doc, "has_more", next_cursor[0] != '\0') &&
             (next_cursor[0] ? cJSON_AddStringToObject(doc, "next_cursor", next_cursor)
                             : cJSON_AddNullToObject(doc, "next_cursor"));
    if (!ok) {
        cJSON_Delete(doc);
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    }
    return reply_json(req, MHD_HTTP_OK, doc);
}

/*
 * Parses the cursor text "<tag><n>" (m NULL) or "<tag><n>_<m>" into *n and *m.  Returns
 * false when text has another form.
 */
bool tasks_cursor_parse(const char *text, char tag, unsigned long long *n, unsigned long long *m)
{
    char *end;

    if (text[0] != tag || text[1] < '0' || text[1] > '9')
        return false;
    errno = 0;
    *n = strtoull(text + 1, &end, 10);
    if (errno != 0)
        return false;
    if (m == NULL)
        return *end == '\0';
    if (end[0] != '_' || end[1] < '0' || end[1] > '9')
        return false;
    *m = strtoull(end + 1, &end, 10);
    return errno == 0 && *end == '\0';
}

/* Sends the 400 a malformed query parameter gets. */
static enum MHD_Result reply_bad_parameter(struct mock_request *req, const char *message)
{
    return reply_error(req, MHD_HTTP_BAD_REQUEST, message, "invalid_request_error",
                       "invalid_parameter");
}

/*
 * GET <lookup prefix>{ref}[?all=1]: answers the newest task of personality p whose client
 * reference is ref, or 404 not_found; with all=1, {"object": "list", "data": [...]} of
 * every such task, newest first.
 */
enum MHD_Result tasks_handle_lookup(struct mock_request *req, const struct mock_personality *p,
                                    const char *ref)
{
    const char *all = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "all");
    struct ledger_task_query q = {.provider = p->name, .client_ref = ref, .limit = 1};
    bool want_all = false;
    enum MHD_Result ret;
    struct collected c = {0};
    cJSON *task;

    /* A slow search: the setting, and random mode's draw. */
    mock_sleep_ms(req, config_get(CFG_LOOKUP_DELAY_MS) + chaos_lookup_delay_ms(), true);
    if (gate_closed(req, &lookup_gate, &ret))
        return ret;
    if (all && (strcmp(all, "1") == 0 || strcmp(all, "true") == 0))
        want_all = true;
    else if (all && strcmp(all, "0") != 0 && strcmp(all, "false") != 0 && all[0] != '\0')
        return reply_bad_parameter(req, "all must be 1, true, 0 or false");
    /* Every task sharing the reference means a resend made more than one; the ledger caps them. */
    if (want_all)
        q.limit = SIZE_MAX;

    c.data = cJSON_CreateArray();
    if (!collect_tasks(&q, &c, NULL)) {
        cJSON_Delete(c.data);
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    }
    if (want_all)
        return reply_list(req, c.data, NULL);
    task = cJSON_DetachItemFromArray(c.data, 0);
    cJSON_Delete(c.data);
    if (task == NULL)
        return reply_error(req, MHD_HTTP_NOT_FOUND, "no task has this client reference",
                           "invalid_request_error", "not_found");
    return reply_json(req, MHD_HTTP_OK, task);
}

/*
 * GET <task path>{id}: answers the task of personality p called id (the same object a
 * lookup answers), or 404 not_found, also while the task is not visible yet.
 */
enum MHD_Result tasks_handle_read(struct mock_request *req, const struct mock_personality *p,
                                  const char *id)
{
    struct ledger_task_query q = {.provider = p->name, .id = id, .limit = 1};
    struct collected c = {0};
    cJSON *task;

    c.data = cJSON_CreateArray();
    if (!collect_tasks(&q, &c, NULL)) {
        cJSON_Delete(c.data);
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    }
    task = cJSON_DetachItemFromArray(c.data, 0);
    cJSON_Delete(c.data);
    if (task == NULL)
        return reply_error(req, MHD_HTTP_NOT_FOUND, "no such task", "invalid_request_error",
                           "not_found");
    return reply_json(req, MHD_HTTP_OK, task);
}

/*
 * Reads the query parameter name as a decimal integer within [min, max] into *out and sets
 * *present.  Leaves both alone when the parameter is absent.  Returns false when it is
 * present but malformed or out of range.
 */
static bool query_integer(struct mock_request *req, const char *name, long long min, long long max,
                          bool *present, long long *out)
{
    const char *text = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, name);
    char *end;
    long long v;

    if (text == NULL)
        return true;
    if (text[0] < '0' || text[0] > '9')
        return false;
    errno = 0;
    v = strtoll(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return false;
    *present = true;
    *out = v;
    return true;
}

/*
 * Answers the request in *ret and returns true when the /_config settings switch the list
 * endpoints off or make them fail, or make a page after the first fail (list_page_status),
 * or a parameter is malformed (400 invalid_parameter); otherwise fills *w (limit 1..1000,
 * default 100, capped by list_page_max) and returns false.
 */
bool tasks_list_refused(struct mock_request *req, struct tasks_window *w, enum MHD_Result *ret)
{
    bool has_limit = false;
    long long limit = LIST_LIMIT_DEFAULT;
    const char *cursor = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "cursor");
    unsigned int page_status, page_max;

    memset(w, 0, sizeof(*w));
    /* A slow list: the setting, and random mode's draw. */
    mock_sleep_ms(req, config_get(CFG_LOOKUP_DELAY_MS) + chaos_lookup_delay_ms(), true);
    if (gate_closed(req, &list_gate, ret))
        return true;
    if (config_get(CFG_LIST_ENVELOPE)) {
        *ret = reply_error(req, 200, "mock: the list is unavailable", "mock_error", "mock_envelope");
        return true;
    }
    w->cursor = cursor && cursor[0] ? cursor : NULL;
    page_status = config_get(CFG_LIST_PAGE_STATUS);
    if (w->cursor && page_status) {
        char message[64], code[32];

        snprintf(message, sizeof(message), "mock status %u", page_status);
        snprintf(code, sizeof(code), "mock_%u", page_status);
        *ret = reply_error(req, page_status, message, "mock_error", code);
        return true;
    }
    if (!query_integer(req, "since", 0, UNIX_SECONDS_MAX, &w->has_since, &w->since)) {
        *ret = reply_bad_parameter(req, "since must be a whole number of Unix seconds");
        return true;
    }
    if (!query_integer(req, "until", 0, UNIX_SECONDS_MAX, &w->has_until, &w->until)) {
        *ret = reply_bad_parameter(req, "until must be a whole number of Unix seconds");
        return true;
    }
    if (!query_integer(req, "limit", 1, LIST_LIMIT_MAX, &has_limit, &limit)) {
        *ret = reply_bad_parameter(req, "limit must be an integer 1..1000");
        return true;
    }
    page_max = config_get(CFG_LIST_PAGE_MAX);
    w->limit = (size_t)limit < page_max ? (size_t)limit : page_max;
    return false;
}

/* Sends the 400 a cursor gets that no page of this list gave. */
enum MHD_Result tasks_reply_bad_cursor(struct mock_request *req)
{
    return reply_bad_parameter(req, "cursor is not one a page of this list gave (or the mock "
                                    "was reset since)");
}

/*
 * GET <list path>?since=&until=&limit=&cursor=: answers {"object": "list", "data": [...],
 * "has_more", "next_cursor"} with the newest tasks of personality p first, one page.  A
 * malformed parameter gets 400.
 */
enum MHD_Result tasks_handle_list(struct mock_request *req, const struct mock_personality *p)
{
    struct ledger_task_query q = {.provider = p->name};
    struct tasks_window w;
    struct collected c = {0};
    enum MHD_Result ret;
    char next[TASKS_CURSOR_MAX] = "";
    bool more = false;

    if (tasks_list_refused(req, &w, &ret))
        return ret;
    q.has_since = w.has_since;
    q.since = w.since;
    q.has_until = w.has_until;
    q.until = w.until;
    q.limit = w.limit;
    if (w.cursor) {
        unsigned long long epoch, pos;

        /* The position in a cursor is only meaningful within the ledger that gave it. */
        if (!tasks_cursor_parse(w.cursor, 't', &epoch, &pos) || epoch != ledger_epoch() ||
            pos == 0 || pos > ULONG_MAX)
            return tasks_reply_bad_cursor(req);
        q.before = (unsigned long)pos;
    }

    c.data = cJSON_CreateArray();
    if (!collect_tasks(&q, &c, &more)) {
        cJSON_Delete(c.data);
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    }
    /* The next page starts below the last task of this one, so new tasks never shift it. */
    if (more)
        snprintf(next, sizeof(next), "t%lu_%lu", ledger_epoch(), c.last_pos);
    return reply_list(req, c.data, next);
}
