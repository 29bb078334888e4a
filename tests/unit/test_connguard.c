/* A kept-alive connection carries a request only while nothing waits on it (connguard.h): the
 * verdict table, and the registry on real loopback connections. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "idemgate/connguard.h"

static void test_verdicts(void **state)
{
    (void)state;
    static const struct {
        int uses;
        ssize_t peeked;
        int err;
        enum cg_verdict v;
        int refuses;
    } rows[] = {
        /* A first exchange is never judged, whatever the socket shows (TLS records). */
        {0, -1, EAGAIN, CG_NEW, 0},
        {0, 1, 0, CG_NEW, 0},
        {0, 0, 0, CG_NEW, 0},
        {1, -1, EAGAIN, CG_CLEAN, 0},
        {7, -1, EWOULDBLOCK, CG_CLEAN, 0},
        {1, -1, EINTR, CG_CLEAN, 0},
        {1, 1, 0, CG_INPUT, 1},
        {1, 0, 0, CG_PEER_CLOSED, 1},
        {1, -1, ECONNRESET, CG_BROKEN, 1},
        {3, -1, ENOTCONN, CG_BROKEN, 1},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        enum cg_verdict v = cg_judge(rows[i].uses, rows[i].peeked, rows[i].err);
        assert_int_equal(v, rows[i].v);
        assert_int_equal(cg_refuses(v), rows[i].refuses);
    }
}

static int port_of(int fd, int peer)
{
    struct sockaddr_in a;
    socklen_t l = sizeof(a);
    assert_int_equal(peer ? getpeername(fd, (struct sockaddr *)&a, &l)
                          : getsockname(fd, (struct sockaddr *)&a, &l),
                     0);
    return ntohs(a.sin_port);
}

/* A registered client socket connected to a loopback listener; *server gets the accepted end. */
static int connected(int *listener, int *server)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    *listener = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(*listener >= 0);
    assert_int_equal(bind(*listener, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(*listener, 4), 0);
    socklen_t l = sizeof(a);
    assert_int_equal(getsockname(*listener, (struct sockaddr *)&a, &l), 0);
    struct curl_sockaddr ca = {.family = AF_INET, .socktype = SOCK_STREAM, .protocol = 0};
    int fd = cg_opensocket(NULL, CURLSOCKTYPE_IPCXN, &ca);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    *server = accept(*listener, NULL, NULL);
    assert_true(*server >= 0);
    return fd;
}

static void test_bytes_waiting_refuse_a_used_connection(void **state)
{
    (void)state;
    int before = cg_registered();
    int listener, server;
    int fd = connected(&listener, &server);
    assert_int_equal(cg_registered(), before + 1);
    CURL *h = (CURL *)&fd; /* only compared */
    int lp = port_of(fd, 0), pp = port_of(fd, 1);

    /* Its first request: not judged, even with a byte already waiting. */
    assert_int_equal(write(server, "x", 1), 1);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 5000), 1);
    assert_int_equal(cg_stale(h, "127.0.0.1", pp, lp), 0);
    char b;
    assert_int_equal(read(fd, &b, 1), 1);

    /* Used once, nothing waiting: it carries the next. */
    assert_int_equal(cg_stale(h, "127.0.0.1", pp, lp), 0);
    assert_int_equal(cg_take_refused(h), 0);

    /* A byte nobody asked for: refused, and remembered once for the engine. */
    assert_int_equal(write(server, "HTTP/1.1 429", 12), 12);
    assert_int_equal(poll(&p, 1, 5000), 1);
    assert_int_equal(cg_stale(h, "127.0.0.1", pp, lp), 1);
    assert_int_equal(cg_take_refused(h), 1);
    assert_int_equal(cg_take_refused(h), 0);
    /* The bytes are still there (peeked, never read). */
    char buf[16];
    assert_int_equal(read(fd, buf, sizeof(buf)), 12);

    /* Its peer closed it: refused. */
    close(server);
    p.revents = 0;
    assert_int_equal(poll(&p, 1, 5000), 1);
    assert_int_equal(cg_stale(h, "127.0.0.1", pp, lp), 1);
    assert_int_equal(cg_take_refused(h), 1);

    assert_int_equal(cg_closesocket(NULL, fd), 0);
    assert_int_equal(cg_registered(), before);
    close(listener);
}

static void test_a_connection_is_told_apart_by_its_peer(void **state)
{
    (void)state;
    int l1, s1, l2, s2;
    int a = connected(&l1, &s1), b = connected(&l2, &s2);
    CURL *h = (CURL *)&a;
    int la = port_of(a, 0), pa = port_of(a, 1), lb = port_of(b, 0), pb = port_of(b, 1);
    assert_int_equal(cg_stale(h, "127.0.0.1", pa, la), 0);
    assert_int_equal(cg_stale(h, "127.0.0.1", pb, lb), 0);
    /* Bytes wait on b only. */
    assert_int_equal(write(s2, "z", 1), 1);
    struct pollfd p = {.fd = b, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 5000), 1);
    assert_int_equal(cg_stale(h, "127.0.0.1", pa, la), 0);
    assert_int_equal(cg_stale(h, "127.0.0.1", pb, lb), 1);
    assert_int_equal(cg_take_refused(h), 1);
    /* The same local port towards another peer is another connection: never judged as b. */
    assert_int_equal(cg_stale(h, "127.0.0.1", pb + 1 == 65536 ? 1 : pb + 1, lb), 0);
    /* A connection nobody registered (its socket opened elsewhere) is never refused. */
    assert_int_equal(cg_stale(h, "127.0.0.2", 1, 1), 0);
    assert_int_equal(cg_take_refused(h), 0);
    cg_closesocket(NULL, a);
    cg_closesocket(NULL, b);
    close(s1);
    close(s2);
    close(l1);
    close(l2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verdicts),
        cmocka_unit_test(test_bytes_waiting_refuse_a_used_connection),
        cmocka_unit_test(test_a_connection_is_told_apart_by_its_peer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
