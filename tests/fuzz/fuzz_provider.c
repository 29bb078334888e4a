/* libFuzzer harness: every reader of a provider's answer, under every profile in
 * deploy/providers/ (loaded once at start): the delay hints of a create's answer
 * (attempt_server_hint_ms), outputs and usage (attempt_count_results), an async create's task id
 * and poll URL (attempt_read_task), the task status (prof_task_status), the outputs of a finished
 * task (poller_outputs) and its error, a task read back for adoption (prov_task_is), exact ids
 * (prov_id_doc, prov_read_id) in lookups, list pages and webhook deliveries.
 *
 * Input: the first line is the allow-listed response headers as JSON (what up_call stores), the
 * second the HTTP status, the rest the body. Properties checked:
 * - a hint is -1 or in 0..BO_DELAY_MAX_MS; a Retry-After date is never read against a Date
 *   header that is not an HTTP-date;
 * - an id is 1..255 bytes; a poll URL kept is on the provider's own origin;
 * - a status is -1 or a canonical task status; the outputs are what was counted;
 * - prov_id_doc accepts exactly the bodies cJSON accepts whole (it only quotes integers). */
#include "fuzz.h"

#include "idemgate/attempt.h"
#include "idemgate/backoff.h"
#include "idemgate/log.h"
#include "idemgate/poller.h"
#include "idemgate/profile.h"
#include "idemgate/provider.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <time.h>

#ifndef IG_FUZZ_PROFILES
#error "IG_FUZZ_PROFILES must name the folder of provider profiles"
#endif

static struct cfg_provider *provs;
static size_t n_provs;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    log_set_level(LOG_ERROR); /* a refused poll URL is logged at warn: keep the run quiet */
    cJSON *arr = cJSON_CreateArray();
    DIR *d = opendir(IG_FUZZ_PROFILES);
    struct dirent *e;
    int i = 0;
    while (d && (e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".json") != 0)
            continue;
        char name[32];
        snprintf(name, sizeof(name), "p%d", i++);
        cJSON *entry = cJSON_CreateObject();
        cJSON_AddStringToObject(entry, "name", name);
        cJSON_AddStringToObject(entry, "profile", e->d_name);
        cJSON_AddItemToArray(arr, entry);
    }
    if (d)
        closedir(d);
    char err[512];
    if (i == 0 || prof_load_all(arr, "fuzz", IG_FUZZ_PROFILES, &provs, &n_provs, err,
                                sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_provider: cannot load the profiles: %s\n", i ? err : "none");
        abort();
    }
    cJSON_Delete(arr);
    return 0;
}

static int in_range(long long v)
{
    return v == -1 || (v >= 0 && v <= BO_DELAY_MAX_MS);
}

/* The Retry-After date property: with a Date header that is not an HTTP-date (delay-seconds
 * digits, say), the date is read against this host's clock. */
static void check_hint(const struct cfg_provider *p, const struct up_response *res)
{
    long long t0 = (long long)time(NULL);
    long long hint = attempt_server_hint_ms(p, res);
    long long t1 = (long long)time(NULL);
    FZ_CHECK(in_range(hint), "a hint is -1 or a delay in range");
    cJSON *h = cJSON_Parse(res->headers_json);
    const char *ms = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(h, "retry-after-ms"));
    const char *ra = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(h, "retry-after"));
    const char *date = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(h, "date"));
    if (!(ms && bo_retry_after_ms_header(ms) >= 0) && ra && date) {
        const char *q = ra;
        while (*q == ' ' || *q == '\t')
            q++;
        const char *dq = date;
        while (*dq == ' ' || *dq == '\t')
            dq++;
        int ra_is_date = bo_retry_after_ms(ra, 0) >= 0 && !(*q >= '0' && *q <= '9');
        int date_is_date = bo_retry_after_ms(date, 0) >= 0 && !(*dq >= '0' && *dq <= '9');
        if (ra_is_date && !date_is_date) {
            long long lo = bo_retry_after_ms(ra, t1), hi = bo_retry_after_ms(ra, t0);
            FZ_CHECK(hint >= lo && hint <= hi,
                     "a Retry-After date is not read against a Date that is not a date");
        }
    }
    cJSON_Delete(h);
}

static void on_item(const cJSON *item, void *arg)
{
    const struct cfg_provider *p = arg;
    (void)jpath_string(p->list_match, item);
    const char *id = p->list_id ? prov_read_id(p->list_id, item) : NULL;
    FZ_CHECK(!id || (*id && strlen(id) <= 255), "a list id is 1..255 bytes");
}

static void check_ids(const struct cfg_provider *p, const char *body, size_t len)
{
    cJSON *doc = prov_id_doc(body, len);
    /* prov_id_doc only turns integer tokens into strings: it accepts what cJSON accepts whole. */
    if (!memchr(body, '\0', len)) {
        const char *end = NULL;
        cJSON *ref = cJSON_ParseWithLengthOpts(body, len, &end, 0);
        if (ref && end) {
            while (end < body + len && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n'))
                end++;
            if (end != body + len) {
                cJSON_Delete(ref);
                ref = NULL;
            }
        }
        FZ_CHECK((doc != NULL) == (ref != NULL), "prov_id_doc accepts what cJSON accepts");
        cJSON_Delete(ref);
    }
    if (!doc)
        return;
    const struct jpath *paths[] = {p->lookup_id, p->task_id, p->webhook_task_id,
                                   p->webhook_client_ref};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        const char *id = prov_read_id(paths[i], doc);
        FZ_CHECK(!id || (*id && strlen(id) <= 255), "an id is 1..255 bytes");
    }
    if (p->list_items)
        jpath_each(p->list_items, doc, on_item, (void *)p);
    if (p->list_next_cursor)
        (void)jpath_string(p->list_next_cursor, doc);
    if (p->webhook_event_id)
        (void)jpath_string(p->webhook_event_id, doc);
    cJSON_Delete(doc);
}

static void check_status_and_outputs(const struct cfg_provider *p, const struct up_response *res)
{
    cJSON *doc = cJSON_ParseWithLength(res->body, res->body_len);
    int st = prof_task_status(p, res->http_status, doc);
    FZ_CHECK(st == -1 || (st >= 0 && st < TS__COUNT), "a status is canonical or unknown");
    if (p->mode == CFG_MODE_ASYNC_POLL && p->result_kind) {
        cJSON *outs = cJSON_CreateArray();
        int n = poller_outputs(p, doc, "task_1", outs);
        FZ_CHECK(n == cJSON_GetArraySize(outs), "outputs counted as collected");
        cJSON_Delete(outs);
    }
    if (doc && p->result_error)
        (void)jpath_string(p->result_error, doc);
    if (doc && p->result_fetch_url)
        (void)jpath_string(p->result_fetch_url, doc);
    cJSON_Delete(doc);
    (void)prov_task_is(p, res, "ref_1");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_parts in;
    fz_split(data, size, 3, &in);
    struct up_response res = {0};
    res.headers_json = in.part[0];
    res.http_status = atoi(in.part[1]);
    res.body = in.part[2];
    res.body_len = in.len[2];
    for (size_t i = 0; i < n_provs; i++) {
        const struct cfg_provider *p = &provs[i];
        check_hint(p, &res);
        struct attempt_results rs;
        attempt_count_results(p, &res, &rs);
        FZ_CHECK(rs.received >= -1, "outputs received");
        free(rs.usage);
        if (p->mode == CFG_MODE_ASYNC_POLL) {
            struct attempt_task t = {0};
            attempt_read_task(p, &res, &t);
            FZ_CHECK(!t.remote_id || (*t.remote_id && strlen(t.remote_id) <= 255),
                     "a task id is 1..255 bytes");
            FZ_CHECK(!t.poll_url || prov_same_origin(t.poll_url, p->base_url),
                     "a poll URL kept is on the provider's origin");
            free(t.remote_id);
            free(t.poll_url);
        }
        check_status_and_outputs(p, &res);
        check_ids(p, res.body, res.body_len);
    }
    fz_parts_free(&in);
    return 0;
}
