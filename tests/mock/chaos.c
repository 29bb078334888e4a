/*
 * idemgate-mock: random mode, the mock half of the randomised fault campaign (see chaos.h).
 */
#include "chaos.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "reply.h"

/* Largest weight of one behaviour, so that the sum of all of them cannot overflow. */
#define WEIGHT_MAX 1000000u

/* Largest lookup_delay_ms_max, the same bound as any other delay. */
#define LOOKUP_DELAY_MAX (600u * 1000u)

/* Largest magnitude of a seed: every integer up to it is exact in a JSON number (2^53 - 1). */
#define SEED_MAX_ABS 9007199254740991.0

/* Mixed into the seed for the second stream, the one lookups and lists draw their delays from. */
#define LOOKUP_STREAM 0x6c6f6f6b75707321ULL

/* Splitmix64's increment (the golden ratio in 64 bits). */
#define GOLDEN_GAMMA 0x9e3779b97f4a7c15ULL

/* Returns the next output of splitmix64 and advances *state. */
static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += GOLDEN_GAMMA);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Returns a number in [lo, hi] drawn from *state. */
static unsigned int uniform(uint64_t *state, unsigned int lo, unsigned int hi)
{
    return lo + (unsigned int)(splitmix64(state) % ((uint64_t)hi - lo + 1));
}

/* ---- Behaviours -------------------------------------------------------------------- */

/* Sets the fault called name in *c. */
static void set_fault(struct mock_controls *c, const char *name)
{
    c->fault = faults_find(name);
    if (c->fault)
        c->set |= CTRL_FAULT;
}

/* Sets the status in *c. */
static void set_status(struct mock_controls *c, unsigned int status)
{
    c->status = status;
    c->set |= CTRL_STATUS;
}

/* Sets "Retry-After: 1" in *c. */
static void set_retry_after_1(struct mock_controls *c)
{
    snprintf(c->retry_after, sizeof(c->retry_after), "1");
    c->set |= CTRL_RETRY_AFTER;
}

static void apply_ok(struct mock_controls *c, uint64_t *rng)
{
    (void)c;
    (void)rng;
}

static void apply_hang(struct mock_controls *c, uint64_t *rng)
{
    (void)rng;
    set_fault(c, "hang");
}

static void apply_close(struct mock_controls *c, uint64_t *rng)
{
    (void)rng;
    set_fault(c, "close");
}

static void apply_reset(struct mock_controls *c, uint64_t *rng)
{
    (void)rng;
    set_fault(c, "reset");
}

static void apply_truncate(struct mock_controls *c, uint64_t *rng)
{
    (void)rng;
    set_fault(c, "truncate");
}

/* A 5xx that a CDN sends after the origin accepted the work: the task is made. */
static void apply_task_made_5xx(struct mock_controls *c, uint64_t *rng)
{
    static const unsigned int statuses[] = {500, 502, 504, 520, 521, 522, 523, 524};

    set_status(c, statuses[uniform(rng, 0, sizeof(statuses) / sizeof(statuses[0]) - 1)]);
    c->task_made = true;
    c->set |= CTRL_TASK_MADE;
}

/* A 5xx before anything was made. */
static void apply_status_5xx(struct mock_controls *c, uint64_t *rng)
{
    set_status(c, uniform(rng, 0, 1) ? 502 : 500);
}

static void apply_reject_400(struct mock_controls *c, uint64_t *rng)
{
    (void)rng;
    set_status(c, 400);
}

static void apply_status_429(struct mock_controls *c, uint64_t *rng)
{
    (void)rng;
    set_status(c, 429);
    set_retry_after_1(c);
}

static void apply_status_503(struct mock_controls *c, uint64_t *rng)
{
    (void)rng;
    set_status(c, 503);
    set_retry_after_1(c);
}

static void apply_slow_ok(struct mock_controls *c, uint64_t *rng)
{
    c->delay_ms = uniform(rng, 0, 1500);
    c->set |= CTRL_DELAY;
}

static void apply_late_visible(struct mock_controls *c, uint64_t *rng)
{
    c->visible_after_ms = uniform(rng, 500, 3000);
    c->set |= CTRL_VISIBLE_AFTER;
}

static void apply_task_fails(struct mock_controls *c, uint64_t *rng)
{
    (void)rng;
    c->fail = true;
    c->set |= CTRL_OUTCOME;
}

/* One behaviour a create can draw. */
struct behavior {
    const char *name;
    unsigned int default_weight; /* when POST /_chaos gives no "weights" */
    bool async_only;             /* drawn by asynchronous personalities only */
    void (*apply)(struct mock_controls *c, uint64_t *rng);
};

/* Every behaviour; a new one is one more row.  The order is part of the draw: keep it. */
static const struct behavior behaviors[] = {
    {"ok", 10, false, apply_ok},
    {"hang", 1, false, apply_hang},
    {"close", 1, false, apply_close},
    {"reset", 1, false, apply_reset},
    {"task_made_5xx", 1, false, apply_task_made_5xx},
    {"status_5xx", 1, false, apply_status_5xx},
    {"reject_400", 1, false, apply_reject_400},
    {"status_429", 1, false, apply_status_429},
    {"status_503", 1, false, apply_status_503},
    {"slow_ok", 1, false, apply_slow_ok},
    {"late_visible", 1, false, apply_late_visible},
    {"truncate", 1, false, apply_truncate},
    {"task_fails", 1, true, apply_task_fails},
};

#define BEHAVIOR_COUNT (sizeof(behaviors) / sizeof(behaviors[0]))

/* ---- State ------------------------------------------------------------------------- */

static pthread_mutex_t chaos_lock = PTHREAD_MUTEX_INITIALIZER;
static bool enabled;
static long long seed;
static uint64_t create_rng, lookup_rng;
static unsigned int weights[BEHAVIOR_COUNT];
static unsigned int lookup_delay_max;
/* A slow provider: every create waits this much more, drawn in [min, max] ms (0, 0: off). */
static unsigned int create_delay_min, create_delay_max;
static unsigned long draws[BEHAVIOR_COUNT];

/*
 * When random mode is on, draws a behaviour for a create whose controls *ctrl are empty,
 * fills *ctrl with it and returns its static name; returns NULL, leaving *ctrl alone, when
 * random mode is off.
 */
const char *chaos_draw(bool async, struct mock_controls *ctrl)
{
    struct mock_controls c;
    unsigned long long total = 0, pick;
    size_t b = 0;

    memset(&c, 0, sizeof(c));
    pthread_mutex_lock(&chaos_lock);
    if (!enabled) {
        pthread_mutex_unlock(&chaos_lock);
        return NULL;
    }
    for (size_t i = 0; i < BEHAVIOR_COUNT; i++)
        if (async || !behaviors[i].async_only)
            total += weights[i];
    /* Every create takes one number, even when no behaviour but "ok" can come out. */
    pick = splitmix64(&create_rng);
    pick = total ? pick % total : 0;
    for (size_t i = 0; total && i < BEHAVIOR_COUNT; i++) {
        if (!async && behaviors[i].async_only)
            continue;
        if (pick < weights[i]) {
            b = i;
            break;
        }
        pick -= weights[i];
    }
    behaviors[b].apply(&c, &create_rng);
    if (create_delay_max) {
        c.delay_ms += uniform(&create_rng, create_delay_min, create_delay_max);
        c.set |= CTRL_DELAY;
    }
    if (async) {
        c.webhook.duplicates = uniform(&create_rng, 0, 2);
        c.webhook.delay_ms = uniform(&create_rng, 0, 1000);
        c.webhook.reorder = uniform(&create_rng, 0, 3) == 0;
        c.set |= CTRL_WEBHOOK;
    }
    draws[b]++;
    pthread_mutex_unlock(&chaos_lock);
    *ctrl = c;
    return behaviors[b].name;
}

/* Returns how long a lookup or a list waits: 0..lookup_delay_ms_max, 0 when off. */
unsigned int chaos_lookup_delay_ms(void)
{
    unsigned int ms = 0;

    pthread_mutex_lock(&chaos_lock);
    if (enabled && lookup_delay_max)
        ms = uniform(&lookup_rng, 0, lookup_delay_max);
    pthread_mutex_unlock(&chaos_lock);
    return ms;
}

/* Turns random mode off and forgets the draw counts (POST /_reset). */
void chaos_reset(void)
{
    pthread_mutex_lock(&chaos_lock);
    enabled = false;
    seed = 0;
    lookup_delay_max = 0;
    create_delay_min = create_delay_max = 0;
    memset(weights, 0, sizeof(weights));
    memset(draws, 0, sizeof(draws));
    pthread_mutex_unlock(&chaos_lock);
}

/* ---- Routes ------------------------------------------------------------------------ */

/* Returns the state as {"enabled", "seed", "weights", "lookup_delay_ms_max", "create_delay_ms",
 * "draws"}. */
static cJSON *state_to_json(void)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON *w = cJSON_CreateObject(), *d = cJSON_CreateObject();

    pthread_mutex_lock(&chaos_lock);
    cJSON_AddBoolToObject(doc, "enabled", enabled);
    if (enabled)
        cJSON_AddNumberToObject(doc, "seed", (double)seed);
    else
        cJSON_AddNullToObject(doc, "seed");
    for (size_t i = 0; i < BEHAVIOR_COUNT; i++) {
        cJSON_AddNumberToObject(w, behaviors[i].name, weights[i]);
        cJSON_AddNumberToObject(d, behaviors[i].name, (double)draws[i]);
    }
    cJSON_AddNumberToObject(doc, "lookup_delay_ms_max", lookup_delay_max);
    cJSON *cd = cJSON_AddArrayToObject(doc, "create_delay_ms");
    cJSON_AddItemToArray(cd, cJSON_CreateNumber(create_delay_min));
    cJSON_AddItemToArray(cd, cJSON_CreateNumber(create_delay_max));
    pthread_mutex_unlock(&chaos_lock);
    cJSON_AddItemToObject(doc, "weights", w);
    cJSON_AddItemToObject(doc, "draws", d);
    return doc;
}

/* GET /_chaos: {"enabled", "seed", "weights", "lookup_delay_ms_max", "create_delay_ms",
 * "draws"}. */
enum MHD_Result chaos_handle_get(struct mock_request *req)
{
    return reply_json(req, MHD_HTTP_OK, state_to_json());
}

/* Returns true when v is a JSON integer within [min, max]. */
static bool json_integer(const cJSON *v, double min, double max)
{
    return cJSON_IsNumber(v) && v->valuedouble >= min && v->valuedouble <= max &&
           v->valuedouble == (double)(long long)v->valuedouble;
}

/*
 * Parses the weights object into w: every key a behaviour, every value an integer
 * 0..WEIGHT_MAX; behaviours it leaves out weigh 0.  Returns an error text or NULL.
 */
static const char *parse_weights(const cJSON *obj, unsigned int *w)
{
    const cJSON *item;
    unsigned long long total = 0;

    if (!cJSON_IsObject(obj))
        return "weights must be an object {BEHAVIOUR: WEIGHT, ...}";
    memset(w, 0, BEHAVIOR_COUNT * sizeof(*w));
    cJSON_ArrayForEach(item, obj)
    {
        size_t i = 0;

        while (i < BEHAVIOR_COUNT && strcmp(behaviors[i].name, item->string) != 0)
            i++;
        if (i == BEHAVIOR_COUNT)
            return "unknown behaviour in weights: ok, hang, close, reset, task_made_5xx, "
                   "status_5xx, reject_400, status_429, status_503, slow_ok, late_visible, "
                   "truncate, task_fails are known";
        if (!json_integer(item, 0, WEIGHT_MAX))
            return "a weight must be an integer 0..1000000";
        w[i] = (unsigned int)item->valuedouble;
        total += w[i];
    }
    if (total == 0)
        return "at least one weight must be above 0";
    return NULL;
}

/*
 * POST /_chaos {"seed": INT, "weights": {...}, "lookup_delay_ms_max": INT,
 * "create_delay_ms": [MIN, MAX]} turns random mode on from a fresh seed (the draw counts
 * restart); create_delay_ms makes a slow provider: every create waits MIN..MAX ms more; {"seed": null} turns it off (the counts
 * stay until the next start or reset).  Answers the state, as GET does.
 */
enum MHD_Result chaos_handle_post(struct mock_request *req)
{
    cJSON *doc = cJSON_ParseWithLength(req->body, req->body_len);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(doc, "seed");
    const cJSON *wobj = cJSON_GetObjectItemCaseSensitive(doc, "weights");
    const cJSON *delay = cJSON_GetObjectItemCaseSensitive(doc, "lookup_delay_ms_max");
    const cJSON *cdelay = cJSON_GetObjectItemCaseSensitive(doc, "create_delay_ms");
    const char *problem = NULL;
    unsigned int w[BEHAVIOR_COUNT];
    const cJSON *item;

    if (!cJSON_IsObject(doc)) {
        problem = "the body must be {\"seed\": INT, \"weights\": {...}, "
                  "\"lookup_delay_ms_max\": INT}";
    } else {
        cJSON_ArrayForEach(item, doc)
        {
            if (strcmp(item->string, "seed") != 0 && strcmp(item->string, "weights") != 0 &&
                strcmp(item->string, "lookup_delay_ms_max") != 0 &&
                strcmp(item->string, "create_delay_ms") != 0)
                problem = "unknown key: seed, weights, lookup_delay_ms_max and create_delay_ms "
                          "are known";
        }
    }
    if (!problem && !cJSON_IsNull(s) && !json_integer(s, -SEED_MAX_ABS, SEED_MAX_ABS))
        problem = "seed must be an integer (|seed| < 2^53), or null to turn random mode off";
    if (!problem && delay && !json_integer(delay, 0, LOOKUP_DELAY_MAX))
        problem = "lookup_delay_ms_max must be an integer 0..600000";
    if (!problem && cdelay &&
        (cJSON_GetArraySize(cdelay) != 2 ||
         !json_integer(cJSON_GetArrayItem(cdelay, 0), 0, LOOKUP_DELAY_MAX) ||
         !json_integer(cJSON_GetArrayItem(cdelay, 1), 0, LOOKUP_DELAY_MAX) ||
         cJSON_GetArrayItem(cdelay, 0)->valuedouble > cJSON_GetArrayItem(cdelay, 1)->valuedouble))
        problem = "create_delay_ms must be [MIN, MAX], integers 0 <= MIN <= MAX <= 600000";
    if (!problem && wobj)
        problem = parse_weights(wobj, w);
    if (!problem && !wobj)
        for (size_t i = 0; i < BEHAVIOR_COUNT; i++)
            w[i] = behaviors[i].default_weight;
    if (problem) {
        cJSON_Delete(doc);
        return reply_error(req, MHD_HTTP_BAD_REQUEST, problem, "mock_error", "invalid_chaos");
    }

    pthread_mutex_lock(&chaos_lock);
    if (cJSON_IsNull(s)) {
        enabled = false;
    } else {
        enabled = true;
        seed = (long long)s->valuedouble;
        create_rng = (uint64_t)seed;
        lookup_rng = (uint64_t)seed ^ LOOKUP_STREAM;
        memcpy(weights, w, sizeof(weights));
        lookup_delay_max = delay ? (unsigned int)delay->valuedouble : 0;
        create_delay_min = cdelay ? (unsigned int)cJSON_GetArrayItem(cdelay, 0)->valuedouble : 0;
        create_delay_max = cdelay ? (unsigned int)cJSON_GetArrayItem(cdelay, 1)->valuedouble : 0;
        memset(draws, 0, sizeof(draws));
    }
    pthread_mutex_unlock(&chaos_lock);
    cJSON_Delete(doc);
    return reply_json(req, MHD_HTTP_OK, state_to_json());
}

/* Checks the PRNG against known values; returns the failures and names each on stdout. */
int chaos_self_test(void)
{
    /* The first outputs of splitmix64 seeded with 0 (Vigna's reference implementation). */
    static const uint64_t expected[] = {0xe220a8397b1dcdafULL, 0x6e789e6aa1b965f4ULL,
                                        0x06c45d188009454fULL};
    uint64_t state = 0;
    int failures = 0;

    for (size_t i = 0; i < sizeof(expected) / sizeof(expected[0]); i++) {
        uint64_t got = splitmix64(&state);

        if (got != expected[i]) {
            printf("FAIL chaos: splitmix64(0) output %zu is %016llx, want %016llx\n", i,
                   (unsigned long long)got, (unsigned long long)expected[i]);
            failures++;
        }
    }
    return failures;
}
