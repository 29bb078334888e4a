/*
 * idemgate-mock: the provider's task endpoints, which the gateway reconciles against
 * (see tasks.h).
 */
#include "tasks.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    CFG_COUNT,
};

/* One /_config setting. */
struct config_field {
    const char *name;
    /* True for an on/off switch (a JSON boolean), false for a status: 0 or 400..599. */
    bool is_switch;
    unsigned int initial; /* at start and after /_reset */
};

/* Every setting; a new one is one more row and one more enum config_id. */
static const struct config_field config_table[CFG_COUNT] = {
    [CFG_LOOKUP] = {"lookup", true, 1},                /* the lookup endpoint exists */
    [CFG_LIST] = {"list", true, 1},                    /* the list endpoint exists */
    [CFG_LOOKUP_STATUS] = {"lookup_status", false, 0}, /* the lookup fails with this status */
    [CFG_LIST_STATUS] = {"list_status", false, 0},     /* the list fails with this status */
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
    if (f->is_switch) {
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
        cJSON *v = f->is_switch ? cJSON_CreateBool(values[id] != 0)
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
    char id[LEDGER_TASK_ID_MAX];
    cJSON *obj = cJSON_CreateObject();
    bool ok;

    if (obj == NULL)
        return NULL;
    ledger_task_id(t->seq, id);
    ok = cJSON_AddStringToObject(obj, "id", id) && cJSON_AddStringToObject(obj, "object", "task");
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

/* ledger_each_task() visitor: appends the task object of t to the cJSON array ctx. */
static bool collect_task(const struct ledger_task *t, void *ctx)
{
    cJSON *item = task_to_json(t);

    if (item == NULL)
        return false;
    if (!cJSON_AddItemToArray(ctx, item)) {
        cJSON_Delete(item);
        return false;
    }
    return true;
}

/*
 * Fills data, a cJSON array, with the task objects q selects, newest first.  Returns
 * false when memory ran out.
 */
static bool collect_tasks(const struct ledger_task_query *q, cJSON *data)
{
    return data != NULL && ledger_each_task(q, collect_task, data);
}

/* Sends {"object": "list", "data": data} with status 200, taking data over. */
static enum MHD_Result reply_list(struct mock_request *req, cJSON *data)
{
    cJSON *doc = cJSON_CreateObject();

    if (doc == NULL || !cJSON_AddStringToObject(doc, "object", "list") ||
        !cJSON_AddItemToObject(doc, "data", data)) {
        cJSON_Delete(doc);
        cJSON_Delete(data);
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    }
    return reply_json(req, MHD_HTTP_OK, doc);
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
    cJSON *data, *task;

    if (gate_closed(req, &lookup_gate, &ret))
        return ret;
    if (all && (strcmp(all, "1") == 0 || strcmp(all, "true") == 0))
        want_all = true;
    else if (all && strcmp(all, "0") != 0 && strcmp(all, "false") != 0 && all[0] != '\0')
        return reply_bad_parameter(req, "all must be 1, true, 0 or false");
    /* Every task sharing the reference means a resend made more than one; the ledger caps them. */
    if (want_all)
        q.limit = SIZE_MAX;

    data = cJSON_CreateArray();
    if (!collect_tasks(&q, data)) {
        cJSON_Delete(data);
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    }
    if (want_all)
        return reply_list(req, data);
    task = cJSON_DetachItemFromArray(data, 0);
    cJSON_Delete(data);
    if (task == NULL)
        return reply_error(req, MHD_HTTP_NOT_FOUND, "no task has this client reference",
                           "invalid_request_error", "not_found");
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
 * endpoints off or make them fail, or a parameter is malformed (400 invalid_parameter);
 * otherwise fills *w (limit 1..1000, default 100) and returns false.
 */
bool tasks_list_refused(struct mock_request *req, struct tasks_window *w, enum MHD_Result *ret)
{
    bool has_limit = false;
    long long limit = LIST_LIMIT_DEFAULT;

    memset(w, 0, sizeof(*w));
    if (gate_closed(req, &list_gate, ret))
        return true;
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
    w->limit = (size_t)limit;
    return false;
}

/*
 * GET <list path>?since=&until=&limit=: answers {"object": "list", "data": [...]} with the
 * newest tasks of personality p first.  A malformed parameter gets 400.
 */
enum MHD_Result tasks_handle_list(struct mock_request *req, const struct mock_personality *p)
{
    struct ledger_task_query q = {.provider = p->name};
    struct tasks_window w;
    enum MHD_Result ret;
    cJSON *data;

    if (tasks_list_refused(req, &w, &ret))
        return ret;
    q.has_since = w.has_since;
    q.since = w.since;
    q.has_until = w.has_until;
    q.until = w.until;
    q.limit = w.limit;

    data = cJSON_CreateArray();
    if (!collect_tasks(&q, data)) {
        cJSON_Delete(data);
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    }
    return reply_list(req, data);
}
