/* The call engine's ticks: a ticked call is cut when its tick says so (a create whose lease
 * could not be kept), with the evidence of how far it got; a ticked call submitted to a stopped
 * engine is never made. Against a local socket that accepts and never answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "idemgate/engine.h"
#include "idemgate/upstream.h"

#include <curl/curl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* A listening socket on 127.0.0.1 that never answers: its port. The kernel completes the
 * handshake (backlog), so the request leaves and no answer ever comes. */
static int silent_listener(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 16) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) < 0)
        return -1;
    *port = ntohs(a.sin_port);
    return fd;
}

struct ended {
    atomic_int done;
    int curl_code;
    long long bytes_sent;
    int http_status;
};

static void on_done(void *arg, struct up_response *res)
{
    struct ended *e = arg;
    e->curl_code = res->curl_code;
    e->bytes_sent = res->bytes_sent;
    e->http_status = res->http_status;
    up_response_fini(res);
    atomic_store(&e->done, 1);
}

struct ticks {
    atomic_int n;
    int cut_at; /* the tick that cuts (1-based); 0: never */
};

static int on_tick(void *arg)
{
    struct ticks *t = arg;
    int n = atomic_fetch_add(&t->n, 1) + 1;
    return t->cut_at && n >= t->cut_at;
}

static struct up_xfer *xfer_to(int port, struct up_response *res)
{
    static char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/x", port);
    struct up_request req = {.method = "POST",
                             .url = url,
                             .body = "{}",
                             .body_len = 2,
                             .connect_timeout_ms = 2000,
                             .total_timeout_ms = 60000, /* beyond the test: only a cut ends it */
                             .max_response_bytes = 1 << 20};
    struct up_xfer *x = NULL;
    return up_xfer_new(&req, &x, res) == 0 ? x : NULL;
}

static void wait_done(struct ended *e)
{
    for (int i = 0; i < 1000 && !atomic_load(&e->done); i++) { /* at most 10 s */
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static void test_a_tick_cuts_its_call(void **state)
{
    (void)state;
    int port, fd = silent_listener(&port);
    assert_true(fd >= 0);
    struct eng *e = eng_start(1, 4, NULL, 0);
    assert_non_null(e);
    assert_int_equal(eng_acquire(e, -1), 1);
    struct up_response res;
    struct up_xfer *x = xfer_to(port, &res);
    assert_non_null(x);
    struct ended end = {0};
    struct ticks t = {.cut_at = 3};
    eng_submit_held_ticked(e, -1, x, on_done, &end, on_tick, &t);
    wait_done(&end);
    assert_int_equal(atomic_load(&end.done), 1);
    assert_int_equal(end.curl_code, CURLE_OPERATION_TIMEDOUT); /* cut, not answered */
    assert_true(end.bytes_sent > 0);                           /* the request had left */
    assert_int_equal(end.http_status, 0);
    assert_true(atomic_load(&t.n) >= 3);
    int ticks_at_end = atomic_load(&t.n);
    struct timespec ts = {1, 200 * 1000 * 1000}; /* more than two tick periods */
    nanosleep(&ts, NULL);
    assert_int_equal(atomic_load(&t.n), ticks_at_end); /* never ticked after its end */
    eng_release(e, -1);
    eng_stop(e);
    eng_free(e);
    close(fd);
}

static void test_a_ticked_call_on_a_stopped_engine_is_not_made(void **state)
{
    (void)state;
    int port, fd = silent_listener(&port);
    assert_true(fd >= 0);
    struct eng *e = eng_start(1, 4, NULL, 0);
    assert_non_null(e);
    eng_stop(e); /* a claim made just before the drain submits after it */
    assert_int_equal(eng_acquire(e, -1), 1);
    struct up_response res;
    struct up_xfer *x = xfer_to(port, &res);
    assert_non_null(x);
    struct ended end = {0};
    struct ticks t = {.cut_at = 0};
    eng_submit_held_ticked(e, -1, x, on_done, &end, on_tick, &t);
    /* (made on this thread, it would have waited for its 60 s total timeout) */
    assert_int_equal(atomic_load(&end.done), 1);
    assert_int_not_equal(end.curl_code, 0);
    assert_int_equal(end.bytes_sent, 0); /* nothing left: another replica sends it */
    assert_int_equal(atomic_load(&t.n), 0);
    eng_release(e, -1);
    eng_free(e);
    close(fd);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_tick_cuts_its_call),
        cmocka_unit_test(test_a_ticked_call_on_a_stopped_engine_is_not_made),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
