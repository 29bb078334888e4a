#include "idemgate/engine.h"

#include "idemgate/connguard.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* Events taken from epoll per wait. */
#define EVENTS_MAX 256
/* The longest an idle loop sleeps (it is woken for submissions and stops anyway). */
#define IDLE_WAIT_MS 1000
/* Pools told when a slot is given back (the dispatcher, the poller, the reconciler, the archive). */
#define ROOM_WAKERS 8

/* A submitted call, from eng_submit (or eng_submit_easy_ticked) until its done ran. */
struct call {
    struct up_xfer *x; /* or NULL: a bare easy handle (h, done_easy) */
    CURL *h;
    int prov;
    int hold; /* the slot stays taken after done (eng_submit_held) */
    eng_done_fn done;
    eng_easy_done_fn done_easy;
    void *arg;
    eng_tick_fn tick; /* or NULL */
    void *tick_arg;
    struct call *next;             /* in the submission queue */
    struct call *ticked_prev, *ticked_next; /* in its loop's ticked calls, while owned */
    int ticked;                             /* linked there */
};

/* One engine thread: its multi handle, its epoll set, and the calls handed to it. */
struct loop {
    struct eng *e;
    pthread_t thread;
    CURLM *multi;
    int ep;                /* epoll */
    int kick_fd;           /* eventfd: a submission or the stop */
    long long timer_at_ms; /* when libcurl wants its timeout action (monotonic ms), or -1 */
    int running;           /* transfers libcurl reports running */
    int owned;             /* calls added to the multi handle and not completed */
    pthread_mutex_t mu;    /* the queue and stopping */
    struct call *head, *tail;
    int stopping;
    int exited; /* the thread left its loop: a late submission is made by its submitter */
    struct call *ticked;    /* owned calls with a tick (eng_submit_held_ticked) */
    long long next_tick_ms; /* when they are ticked next */
};

struct eng {
    int n_loops;
    struct loop *loops;
    atomic_uint next_loop; /* round robin */
    int max_inflight;
    atomic_int used; /* slots taken: reserved or in flight */
    atomic_int inflight;
    int n_providers;
    int *limit;       /* per provider; 0: none */
    atomic_int *busy; /* per provider: slots taken */
    /* Told whenever a slot is given back (eng_on_room); the lock lets a pool leave the table
     * before it is freed while another thread may be calling it. */
    pthread_rwlock_t room_lock;
    struct {
        void (*fn)(void *arg);
        void *arg;
    } room[ROOM_WAKERS];
};

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Takes one unit of *counter if that leaves it at most max (max <= 0: no bound). */
static int take(atomic_int *counter, int max)
{
    int v = atomic_load(counter);
    do {
        if (max > 0 && v >= max)
            return 0;
    } while (!atomic_compare_exchange_weak(counter, &v, v + 1));
    return 1;
}

int eng_acquire(struct eng *e, int prov)
{
    if (!take(&e->used, e->max_inflight))
        return 0;
    if (prov >= 0 && prov < e->n_providers && !take(&e->busy[prov], e->limit[prov])) {
        atomic_fetch_sub(&e->used, 1);
        return 0;
    }
    return 1;
}

void eng_assign(struct eng *e, int prov)
{
    if (prov >= 0 && prov < e->n_providers)
        atomic_fetch_add(&e->busy[prov], 1);
}

void eng_acquire_more(struct eng *e)
{
    atomic_fetch_add(&e->used, 1);
}

void eng_release(struct eng *e, int prov)
{
    if (prov >= 0 && prov < e->n_providers)
        atomic_fetch_sub(&e->busy[prov], 1);
    atomic_fetch_sub(&e->used, 1);
    pthread_rwlock_rdlock(&e->room_lock);
    for (int i = 0; i < ROOM_WAKERS; i++)
        if (e->room[i].fn)
            e->room[i].fn(e->room[i].arg);
    pthread_rwlock_unlock(&e->room_lock);
}

void eng_on_room(struct eng *e, void (*fn)(void *arg), void *arg)
{
    pthread_rwlock_wrlock(&e->room_lock);
    for (int i = 0; i < ROOM_WAKERS; i++)
        if (!e->room[i].fn) {
            e->room[i].fn = fn;
            e->room[i].arg = arg;
            break;
        }
    pthread_rwlock_unlock(&e->room_lock);
}

void eng_room_off(struct eng *e, void *arg)
{
    pthread_rwlock_wrlock(&e->room_lock);
    for (int i = 0; i < ROOM_WAKERS; i++)
        if (e->room[i].fn && e->room[i].arg == arg)
            e->room[i].fn = NULL;
    pthread_rwlock_unlock(&e->room_lock);
}

int eng_provider_full(const struct eng *e, int prov)
{
    return prov >= 0 && prov < e->n_providers && e->limit[prov] > 0 &&
           atomic_load(&e->busy[prov]) >= e->limit[prov];
}

int eng_room(const struct eng *e)
{
    int free_slots = e->max_inflight - atomic_load(&e->used);
    return free_slots > 0 ? free_slots : 0;
}

int eng_inflight(const struct eng *e)
{
    return atomic_load(&e->inflight);
}

/* CURLMOPT_SOCKETFUNCTION: keeps the epoll set in step with what libcurl waits for. */
static int on_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    (void)easy;
    (void)socketp;
    struct loop *L = userp;
    if (what == CURL_POLL_REMOVE) {
        (void)epoll_ctl(L->ep, EPOLL_CTL_DEL, s, NULL);
        return 0;
    }
    struct epoll_event ev = {.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) |
                                       ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u),
                             .data.fd = s};
    if (epoll_ctl(L->ep, EPOLL_CTL_MOD, s, &ev) < 0 && errno == ENOENT &&
        epoll_ctl(L->ep, EPOLL_CTL_ADD, s, &ev) < 0) {
        LOG(LOG_ERROR, "engine_epoll", LI("errno", errno));
        return -1; /* libcurl fails the transfer: its evidence says how far it got */
    }
    return 0;
}

/* CURLMOPT_TIMERFUNCTION: one timer per multi handle (-1: none). */
static int on_timer(CURLM *multi, long timeout_ms, void *userp)
{
    (void)multi;
    struct loop *L = userp;
    L->timer_at_ms = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    return 0;
}

/* The easy handle of a call. */
static CURL *call_easy(const struct call *c)
{
    return c->x ? (CURL *)up_xfer_easy(c->x) : c->h;
}

/* Tells the call's owner that it ended with curl_code (the slot is given back first). */
static void call_done(struct eng *e, struct call *c, int curl_code)
{
    atomic_fetch_sub(&e->inflight, 1);
    metrics_calls_in_flight(-1);
    if (!c->hold)
        eng_release(e, c->prov);
    if (c->x) {
        struct up_response res;
        (void)up_xfer_finish(c->x, curl_code, &res);
        c->done(c->arg, &res);
    } else {
        c->done_easy(c->arg, curl_code);
    }
}

/* Takes c out of its loop's ticked calls (if it is there). */
static void unlink_ticked(struct loop *L, struct call *c)
{
    if (!c->ticked)
        return;
    if (c->ticked_prev)
        c->ticked_prev->ticked_next = c->ticked_next;
    else
        L->ticked = c->ticked_next;
    if (c->ticked_next)
        c->ticked_next->ticked_prev = c->ticked_prev;
    c->ticked = 0;
}

/* Ends one call: its evidence goes to its done, its slot back to the engine first (so the one
 * told of the result may claim again at once). */
static void complete(struct loop *L, struct call *c, int curl_code)
{
    unlink_ticked(L, c);
    call_done(L->e, c, curl_code);
    free(c);
}

/* Ticks the loop's ticked calls (at most every ENG_TICK_MS); a call its tick cuts is taken out
 * of the multi handle and ended as timed out. */
static void tick_calls(struct loop *L)
{
    long long now = now_ms();
    if (!L->ticked || now < L->next_tick_ms)
        return;
    L->next_tick_ms = now + ENG_TICK_MS;
    struct call *next;
    for (struct call *c = L->ticked; c; c = next) {
        next = c->ticked_next;
        if (!c->tick(c->tick_arg))
            continue;
        /* Removed mid-transfer, its connection is closed (never reused half-read). */
        curl_multi_remove_handle(L->multi, call_easy(c));
        L->owned--;
        complete(L, c, CURLE_OPERATION_TIMEDOUT);
    }
}

/* Moves the queued submissions into the multi handle. */
static void take_submissions(struct loop *L)
{
    uint64_t v;
    ssize_t r = read(L->kick_fd, &v, sizeof(v));
    (void)r;
    pthread_mutex_lock(&L->mu);
    struct call *c = L->head;
    L->head = L->tail = NULL;
    pthread_mutex_unlock(&L->mu);
    while (c) {
        struct call *next = c->next;
        CURLMcode mc = curl_multi_add_handle(L->multi, call_easy(c));
        if (mc == CURLM_OK) {
            L->owned++;
            if (c->tick) {
                c->ticked_prev = NULL;
                c->ticked_next = L->ticked;
                if (L->ticked)
                    L->ticked->ticked_prev = c;
                L->ticked = c;
                c->ticked = 1;
            }
        } else {
            /* Never added: nothing was sent (the evidence shows no byte). */
            LOG(LOG_ERROR, "engine_add_failed", LS("error", curl_multi_strerror(mc)));
            complete(L, c, CURLE_OUT_OF_MEMORY);
        }
        c = next;
    }
}

/* Hands every finished transfer to its done. */
static void read_done(struct loop *L)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(L->multi, &left))) {
        if (m->msg != CURLMSG_DONE)
            continue;
        CURL *easy = m->easy_handle;
        int code = (int)m->data.result;
        struct call *c = NULL;
        curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&c); /* set by eng_submit */
        /* Refused before its first byte because its kept-alive connection had bytes waiting
         * (connguard.h): started again, once, on a new connection. Else the connection it
         * leaves alive, if any, has carried one more exchange. */
        int refused = code == CURLE_ABORTED_BY_CALLBACK && cg_take_refused(easy);
        if (!refused)
            cg_done(easy);
        curl_multi_remove_handle(L->multi, easy);
        if (refused) {
            if (c->x)
                up_xfer_restart(c->x);
            else
                curl_easy_setopt(easy, CURLOPT_FRESH_CONNECT, 1L);
            if (curl_multi_add_handle(L->multi, easy) == CURLM_OK)
                continue;
        }
        L->owned--;
        complete(L, c, code);
    }
}

static int loop_done(struct loop *L)
{
    pthread_mutex_lock(&L->mu);
    int done = L->stopping && !L->head && L->owned == 0;
    L->exited = done;
    pthread_mutex_unlock(&L->mu);
    return done;
}

static void *loop_main(void *arg)
{
    struct loop *L = arg;
    (void)pthread_setname_np(pthread_self(), "ig-engine"); /* ps -L, top -H, perf */
    struct epoll_event evs[EVENTS_MAX];
    while (!loop_done(L)) {
        long long now = now_ms();
        int wait = IDLE_WAIT_MS;
        if (L->timer_at_ms >= 0)
            wait = L->timer_at_ms <= now ? 0 : (int)(L->timer_at_ms - now);
        if (wait > IDLE_WAIT_MS)
            wait = IDLE_WAIT_MS;
        if (L->ticked) { /* woken for the next tick, never later */
            long long until_tick = L->next_tick_ms > now ? L->next_tick_ms - now : 0;
            if (wait > until_tick)
                wait = (int)until_tick;
        }
        int n = epoll_wait(L->ep, evs, EVENTS_MAX, wait);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == L->kick_fd) {
                take_submissions(L);
                continue;
            }
            int flags = ((evs[i].events & EPOLLIN) ? CURL_CSELECT_IN : 0) |
                        ((evs[i].events & EPOLLOUT) ? CURL_CSELECT_OUT : 0) |
                        ((evs[i].events & (EPOLLERR | EPOLLHUP)) ? CURL_CSELECT_ERR : 0);
            curl_multi_socket_action(L->multi, fd, flags, &L->running);
        }
        if (L->timer_at_ms >= 0 && now_ms() >= L->timer_at_ms) {
            L->timer_at_ms = -1;
            curl_multi_socket_action(L->multi, CURL_SOCKET_TIMEOUT, 0, &L->running);
        }
        read_done(L);
        tick_calls(L);
    }
    return NULL;
}

/* Queues call c on a loop, or makes it here when the engine has stopped. */
static void submit(struct eng *e, struct call *c)
{
    atomic_fetch_add(&e->inflight, 1);
    metrics_calls_in_flight(1);
    /* The easy handle's private pointer names the call from here on. */
    curl_easy_setopt(call_easy(c), CURLOPT_PRIVATE, c);
    struct loop *L = &e->loops[atomic_fetch_add(&e->next_loop, 1) % (unsigned)e->n_loops];
    pthread_mutex_lock(&L->mu);
    if (L->exited) {
        pthread_mutex_unlock(&L->mu);
        /* Stopped (a claim made just before the drain): made here, not dropped — but not one
         * that must be ticked (a create that keeps its lease while it runs: made here it would
         * run its whole create_total_ms unrenewed, past its lease): it ends before its first
         * byte, not sent, for any replica to send. */
        call_done(e, c,
                  c->tick ? CURLE_ABORTED_BY_CALLBACK : (int)curl_easy_perform(call_easy(c)));
        free(c);
        return;
    }
    /* Only the first submission into an empty queue kicks: take_submissions reads the kick
     * before it takes the queue, so the queue is never left non-empty without one. */
    int kick = L->head == NULL;
    if (L->tail)
        L->tail->next = c;
    else
        L->head = c;
    L->tail = c;
    pthread_mutex_unlock(&L->mu);
    if (kick) {
        uint64_t one = 1;
        ssize_t w = write(L->kick_fd, &one, sizeof(one));
        (void)w;
    }
}

static void submit_xfer(struct eng *e, int prov, int hold, struct up_xfer *x, eng_done_fn done,
                        void *arg, eng_tick_fn tick, void *tick_arg)
{
    struct call *c = malloc(sizeof(*c));
    if (!c) {
        struct up_response res;
        (void)up_xfer_finish(x, CURLE_OUT_OF_MEMORY, &res);
        if (!hold)
            eng_release(e, prov);
        done(arg, &res);
        return;
    }
    *c = (struct call){
        .x = x, .prov = prov, .hold = hold, .done = done, .arg = arg, .tick = tick,
        .tick_arg = tick_arg};
    submit(e, c);
}

void eng_submit(struct eng *e, int prov, struct up_xfer *x, eng_done_fn done, void *arg)
{
    submit_xfer(e, prov, 0, x, done, arg, NULL, NULL);
}

void eng_submit_held(struct eng *e, int prov, struct up_xfer *x, eng_done_fn done, void *arg)
{
    submit_xfer(e, prov, 1, x, done, arg, NULL, NULL);
}

void eng_submit_held_ticked(struct eng *e, int prov, struct up_xfer *x, eng_done_fn done,
                            void *arg, eng_tick_fn tick, void *tick_arg)
{
    submit_xfer(e, prov, 1, x, done, arg, tick, tick_arg);
}

void eng_submit_easy_ticked(struct eng *e, int prov, void *h, eng_easy_done_fn done, void *arg,
                            eng_tick_fn tick, void *tick_arg)
{
    struct call *c = malloc(sizeof(*c));
    if (!c) {
        eng_release(e, prov);
        done(arg, CURLE_OUT_OF_MEMORY);
        return;
    }
    *c = (struct call){
        .h = h, .prov = prov, .done_easy = done, .arg = arg, .tick = tick, .tick_arg = tick_arg};
    submit(e, c);
}

static void loop_fini(struct loop *L)
{
    if (L->multi)
        curl_multi_cleanup(L->multi);
    if (L->ep >= 0)
        close(L->ep);
    if (L->kick_fd >= 0)
        close(L->kick_fd);
    pthread_mutex_destroy(&L->mu);
}

static int loop_init(struct loop *L, struct eng *e)
{
    memset(L, 0, sizeof(*L));
    L->e = e;
    L->timer_at_ms = -1;
    L->ep = epoll_create1(EPOLL_CLOEXEC);
    L->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    L->multi = curl_multi_init();
    pthread_mutex_init(&L->mu, NULL);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = L->kick_fd};
    if (L->ep < 0 || L->kick_fd < 0 || !L->multi ||
        epoll_ctl(L->ep, EPOLL_CTL_ADD, L->kick_fd, &ev) < 0) {
        loop_fini(L);
        return -1;
    }
    curl_multi_setopt(L->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(L->multi, CURLMOPT_SOCKETDATA, L);
    curl_multi_setopt(L->multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(L->multi, CURLMOPT_TIMERDATA, L);
    return 0;
}

void eng_free(struct eng *e)
{
    if (!e)
        return;
    for (int i = 0; i < e->n_loops; i++)
        loop_fini(&e->loops[i]);
    free(e->loops);
    free(e->limit);
    free(e->busy);
    pthread_rwlock_destroy(&e->room_lock);
    free(e);
}

struct eng *eng_start(int threads, int max_inflight, const int *per_provider, int n_providers)
{
    struct eng *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->max_inflight = max_inflight;
    e->n_providers = n_providers;
    pthread_rwlock_init(&e->room_lock, NULL);
    e->loops = calloc((size_t)(threads > 0 ? threads : 1), sizeof(*e->loops));
    e->limit = calloc((size_t)n_providers + 1, sizeof(*e->limit));
    e->busy = calloc((size_t)n_providers + 1, sizeof(*e->busy));
    if (!e->loops || !e->limit || !e->busy) {
        eng_free(e);
        return NULL;
    }
    for (int i = 0; i < n_providers; i++)
        e->limit[i] = per_provider ? per_provider[i] : 0;
    for (int i = 0; i < (threads > 0 ? threads : 1); i++) {
        struct loop *L = &e->loops[i];
        if (loop_init(L, e) < 0)
            break;
        if (pthread_create(&L->thread, NULL, loop_main, L) != 0) {
            loop_fini(L);
            break;
        }
        e->n_loops++;
    }
    if (e->n_loops < (threads > 0 ? threads : 1)) {
        LOG(LOG_ERROR, "engine_start_failed", LI("threads", threads));
        eng_stop(e);
        eng_free(e);
        return NULL;
    }
    return e;
}

void eng_stop(struct eng *e)
{
    if (!e)
        return;
    for (int i = 0; i < e->n_loops; i++) {
        struct loop *L = &e->loops[i];
        pthread_mutex_lock(&L->mu);
        L->stopping = 1;
        pthread_mutex_unlock(&L->mu);
        uint64_t one = 1;
        ssize_t w = write(L->kick_fd, &one, sizeof(one));
        (void)w;
    }
    for (int i = 0; i < e->n_loops; i++)
        pthread_join(e->loops[i].thread, NULL);
}
