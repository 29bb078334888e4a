#include "idemgate/api.h"

#include "idemgate/crash.h"
#include "idemgate/crypto.h"
#include "idemgate/headers.h"
#include "idemgate/limits.h"
#include "idemgate/metrics.h"
#include "idemgate/offload.h"
#include "idemgate/problem.h"
#include "idemgate/store.h"
#include "idemgate/tenants.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct api {
    const struct cfg *cfg;
    struct waiters *waiters;
    struct recorder *recorder;
    struct offload *pool;
    struct offload_item limits_item; /* the tenant limits' refresh (limits.h) */
    struct offload_item tenants_item; /* the tenant directory's refresh (tenants.h) */
    pthread_mutex_t mu; /* guards dbs */
    struct db **dbs;    /* every database worker's connection, closed by api_free */
    size_t n_dbs;
};

/* The API's state of one request (hs_req_state). */
struct api_state {
    struct api *api;
    int route;
    struct api_wait wait;
    void (*cont)(struct hs_req *r); /* runs at the next resumption instead of routing */
    void *ctx;                      /* a handler's state across suspensions */
    void (*ctx_free)(void *ctx);
    struct offload_item item; /* api_offload: fn(r, &args) on a database worker */
    atomic_int offloaded;     /* fn is running or queued */
    void (*off_fn)(struct hs_req *r, const struct api_args *a);
    struct api_args off_args;
};

static void state_free(void *arg)
{
    struct api_state *st = arg;
    if (st->ctx && st->ctx_free)
        st->ctx_free(st->ctx);
    free(st);
}

/* One database connection per database worker (the offload pool), opened on first use. */
static __thread struct db *tls_db;

static struct api_state *state_of(const struct hs_req *r)
{
    return hs_req_state(r);
}

const struct cfg *api_cfg(const struct hs_req *r)
{
    return state_of(r)->api->cfg;
}

struct waiters *api_waiters(const struct hs_req *r)
{
    return state_of(r)->api->waiters;
}

struct recorder *api_recorder(const struct hs_req *r)
{
    return state_of(r)->api->recorder;
}

struct api_wait *api_wait(struct hs_req *r)
{
    return &state_of(r)->wait;
}

void api_set_continuation(struct hs_req *r, void (*fn)(struct hs_req *r))
{
    state_of(r)->cont = fn;
}

void (*api_take_continuation(struct hs_req *r))(struct hs_req *r)
{
    struct api_state *st = state_of(r);
    void (*fn)(struct hs_req *) = st->cont;
    st->cont = NULL;
    return fn;
}

void api_set_ctx(struct hs_req *r, void *ctx, void (*free_fn)(void *ctx))
{
    struct api_state *st = state_of(r);
    if (st->ctx && st->ctx_free && st->ctx != ctx)
        st->ctx_free(st->ctx);
    st->ctx = ctx;
    st->ctx_free = free_fn;
}

void *api_ctx(const struct hs_req *r)
{
    return state_of(r)->ctx;
}

void api_set_route(struct hs_req *r, int label)
{
    state_of(r)->route = label;
}

/* The calling database worker's connection, opened on first use. */
static struct db *thread_db(struct api *a)
{
    if (!tls_db) {
        tls_db = store_db_open(a->cfg->database_url);
        if (!tls_db)
            return NULL;
        pthread_mutex_lock(&a->mu);
        struct db **nv = realloc(a->dbs, (a->n_dbs + 1) * sizeof(*nv));
        if (nv) {
            nv[a->n_dbs++] = tls_db;
            a->dbs = nv;
        }
        pthread_mutex_unlock(&a->mu);
    }
    return tls_db;
}

struct db *api_db(const struct hs_req *r)
{
    return thread_db(state_of(r)->api);
}

static void refresh_limits(void *arg)
{
    limits_refresh(thread_db(arg));
}

void api_limits_refresh(struct hs_req *r)
{
    struct api *a = state_of(r)->api;
    if (!limits_refresh_due())
        return;
    a->limits_item.fn = refresh_limits;
    a->limits_item.arg = a;
    if (offload_submit(a->pool, &a->limits_item) < 0)
        limits_refresh(NULL); /* shutting down: marks it done, tried again later */
}

static void refresh_tenants(void *arg)
{
    tenants_refresh(thread_db(arg));
}

void api_tenants_refresh(struct hs_req *r)
{
    api_tenants_refresh_of(state_of(r)->api);
}

void api_tenants_refresh_of(struct api *a)
{
    if (!tenants_refresh_due())
        return;
    a->tenants_item.fn = refresh_tenants;
    a->tenants_item.arg = a;
    if (offload_submit(a->pool, &a->tenants_item) < 0)
        tenants_refresh(NULL); /* shutting down: marks it done, tried again later */
}

/* A bug's answer rather than a request routed again and again. */
static void answer_nothing(struct hs_req *r)
{
    char body[PROBLEM_BODY_MAX];
    const struct problem p = {.status = 500,
                              .type = "internal",
                              .title = "Internal error",
                              .detail = "no response was produced",
                              .request_id = hs_req_id(r)};
    size_t n = problem_render(&p, body, sizeof(body));
    (void)hs_respond(r, 500, PROBLEM_CONTENT_TYPE, body, n, NULL);
}

/* On a database worker: the work, then the request goes on (its answer is queued, or its
 * continuation runs) on a server thread. */
static void run_offloaded(void *arg)
{
    struct hs_req *r = arg;
    struct api_state *st = state_of(r);
    CRASH_POINT("offloaded_run");
    st->off_fn(r, &st->off_args);
    if (!st->cont && !hs_req_answered(r))
        st->cont = answer_nothing;
    atomic_store(&st->offloaded, 0);
    hs_release(r); /* (r is not touched after this: its answer may complete and free it) */
}

int api_req_offloaded(const struct hs_req *r)
{
    const struct api_state *st = state_of(r);
    return st && atomic_load(&st->offloaded);
}

/* The caller an offloaded request is queued as (its lane, offload.h): a live tenant by its
 * token's hash (however "Bearer" and spaces are written: one lane per tenant), the operator, each
 * provider's webhooks, the probes and the scrapes by themselves — and every token no live tenant
 * holds in one lane, so a flood of made-up tokens is one caller, not sixty-four. */
static size_t offload_key(struct hs_req *r, const struct api_state *st, char *key, size_t cap)
{
    if (st->route == MR_WEBHOOK) {
        /* a configured provider's webhooks by that provider; any other path is one caller */
        const char *path = hs_req_path(r), *name = strrchr(path, '/');
        name = name ? name + 1 : "";
        return cfg_find_provider(st->api->cfg, name, strlen(name))
                   ? (size_t)snprintf(key, cap, "webhook %.80s", name)
                   : (size_t)snprintf(key, cap, "webhook ?");
    }
    if (st->route == MR_READY || st->route == MR_METRICS || st->route == MR_HEALTH)
        return (size_t)snprintf(key, cap, "probe %d", st->route);
    /* The tenant as the directory last read it, however long ago: a lane is no answer (the
     * handler checks the token), and a quiet gateway's tenants would otherwise queue in the
     * lane every unknown token shares until the directory is read again. */
    long long id = api_token_caller(st->api, hs_req_header(r, "Authorization"));
    if (id == API_CALLER_ADMIN)
        return (size_t)snprintf(key, cap, "admin");
    if (id > 0)
        return (size_t)snprintf(key, cap, "tenant %lld", id);
    return (size_t)snprintf(key, cap, "%s", OFFLOAD_UNTRUSTED_KEY);
}

long long api_token_caller(const struct api *a, const char *authorization)
{
    size_t len = 0;
    const char *t = hdr_bearer(authorization, &len);
    if (!t)
        return API_CALLER_UNKNOWN;
    char hash[CRYPTO_SHA256_HEX];
    crypto_sha256_hex(t, len, hash);
    const char *admin = a->cfg->admin_token_sha256;
    if (strlen(admin) == 64 && crypto_ct_equal(hash, admin, 64))
        return API_CALLER_ADMIN;
    long long id = tenants_known(hash);
    return id > 0 ? id : API_CALLER_UNKNOWN;
}

int api_offload(struct hs_req *r, void (*fn)(struct hs_req *r, const struct api_args *a),
                const struct api_args *args)
{
    struct api_state *st = state_of(r);
    st->off_fn = fn;
    if (args)
        st->off_args = *args;
    else
        memset(&st->off_args, 0, sizeof(st->off_args));
    st->item.fn = run_offloaded;
    st->item.arg = r;
    char key[96];
    size_t klen = offload_key(r, st, key, sizeof(key));
    atomic_store(&st->offloaded, 1);
    hs_suspend_held(r);
    if (offload_submit_as(st->api->pool, &st->item, key, klen) < 0) {
        atomic_store(&st->offloaded, 0);
        hs_release(r); /* the caller answers, and the answer is queued on resumption */
        return -1;
    }
    return 0;
}

int api_req_begin(struct hs_req *r, struct api *a)
{
    struct api_state *st = calloc(1, sizeof(*st));
    if (!st)
        return -1;
    st->api = a;
    st->route = MR_OTHER;
    hs_req_set_state(r, st, state_free);
    return 0;
}

int api_req_begun(const struct hs_req *r)
{
    return state_of(r) != NULL;
}

int api_req_route(const struct hs_req *r)
{
    const struct api_state *st = state_of(r);
    return st ? st->route : MR_OTHER;
}

int api_arg(const struct api_args *a, size_t i, char *out, size_t cap)
{
    if (i >= a->n || a->len[i] >= cap)
        return -1;
    memcpy(out, a->arg[i], a->len[i]);
    out[a->len[i]] = '\0';
    return (int)a->len[i];
}

struct api *api_new(const struct cfg *cfg, struct waiters *w, struct recorder *rec,
                    struct offload *pool)
{
    struct api *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->cfg = cfg;
    a->waiters = w;
    a->recorder = rec;
    a->pool = pool;
    pthread_mutex_init(&a->mu, NULL);
    return a;
}

const struct cfg *api_config(const struct api *a)
{
    return a->cfg;
}

void api_free(struct api *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n_dbs; i++)
        store_db_close(a->dbs[i]);
    free(a->dbs);
    pthread_mutex_destroy(&a->mu);
    free(a);
}
