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
        int noted;
        ssize_t peeked;
        int err;
        int tls_pending;
        enum cg_verdict v;
        int refuses;
    } rows[] = {
        /* A first exchange is never judged, whatever the socket shows (TLS records). */
        {0, -1, EAGAIN, 0, CG_NEW, 0},
        {0, 1, 0, 0, CG_NEW, 0},
        {0, 0, 0, 0, CG_NEW, 0},
        {0, -1, EAGAIN, 1, CG_NEW, 0},
        {1, -1, EAGAIN, 0, CG_CLEAN, 0},
        {1, -1, EWOULDBLOCK, 0, CG_CLEAN, 0},
        {1, -1, EINTR, 0, CG_CLEAN, 0},
        {1, 1, 0, 0, CG_INPUT, 1},
        {1, 0, 0, 0, CG_PEER_CLOSED, 1},
        {1, -1, ECONNRESET, 0, CG_BROKEN, 1},
        {1, -1, ENOTCONN, 0, CG_BROKEN, 1},
        /* Bytes OpenSSL read from the socket and nobody took: the socket itself shows none. */
        {1, -1, EAGAIN, 1, CG_INPUT, 1},
        {1, 0, 0, 1, CG_INPUT, 1},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        enum cg_verdict v =
            cg_judge(rows[i].noted, rows[i].peeked, rows[i].err, rows[i].tls_pending);
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

/* A client socket connected to a loopback listener; *server gets the accepted end. */
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
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    *server = accept(*listener, NULL, NULL);
    assert_true(*server >= 0);
    return fd;
}

static void test_bytes_waiting_refuse_a_used_connection(void **state)
{
    (void)state;
    int before = cg_noted();
    int listener, server;
    int fd = connected(&listener, &server);
    /* A real handle with no connection: cg_stale asks it for its TLS session (none). A
     * pointer to anything else, once used as one, made this test crash now and then. */
    CURL *h = curl_easy_init();
    assert_non_null(h);
    int lp = port_of(fd, 0), pp = port_of(fd, 1);

    /* Never noted: its first request is not judged, even with a byte already waiting. */
    assert_int_equal(write(server, "x", 1), 1);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 5000), 1);
    assert_int_equal(cg_stale(h, "127.0.0.1", pp, lp), 0);
    char b;
    assert_int_equal(read(fd, &b, 1), 1);

    /* Its exchange ended and libcurl kept it: nothing waiting, it carries the next. */
    cg_note_use(fd, "127.0.0.1", pp, lp);
    assert_int_equal(cg_noted(), before + 1);
    assert_int_equal(cg_stale(h, "127.0.0.1", pp, lp), 0);
    assert_int_equal(cg_take_refused(h), 0);
    cg_note_use(fd, "127.0.0.1", pp, lp); /* the second exchange: the same connection */
    assert_int_equal(cg_noted(), before + 1);

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
    assert_int_equal(cg_noted(), before);
    close(listener);
    curl_easy_cleanup(h);
}

static void test_a_connection_is_told_apart_by_its_peer(void **state)
{
    (void)state;
    int l1, s1, l2, s2;
    int a = connected(&l1, &s1), b = connected(&l2, &s2);
    CURL *h = curl_easy_init();
    assert_non_null(h);
    int la = port_of(a, 0), pa = port_of(a, 1), lb = port_of(b, 0), pb = port_of(b, 1);
    cg_note_use(a, "127.0.0.1", pa, la);
    cg_note_use(b, "127.0.0.1", pb, lb);
    /* Bytes wait on b only. */
    assert_int_equal(write(s2, "z", 1), 1);
    struct pollfd p = {.fd = b, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 5000), 1);
    assert_int_equal(cg_stale(h, "127.0.0.1", pa, la), 0);
    assert_int_equal(cg_stale(h, "127.0.0.1", pb, lb), 1);
    assert_int_equal(cg_take_refused(h), 1);
    /* The same local port towards another peer is another connection, never noted. */
    assert_int_equal(cg_stale(h, "127.0.0.1", pb == 65535 ? 1 : pb + 1, lb), 0);
    assert_int_equal(cg_stale(h, "127.0.0.2", pb, lb), 0);
    assert_int_equal(cg_take_refused(h), 0);
    cg_closesocket(NULL, a);
    cg_closesocket(NULL, b);
    close(s1);
    close(s2);
    close(l1);
    close(l2);
    curl_easy_cleanup(h);
}

/* A connection noted at its first request (cg_note_fresh, among the sockets its transfer opened)
 * is judged at its next one, before any transfer's end noted it (cg_done): the engine notes an
 * end only after libcurl may already have started the next request on that connection. */
static void test_a_connection_is_noted_from_its_first_request(void **state)
{
    (void)state;
    int l1, s1, l2, s2;
    int a = connected(&l1, &s1), other = connected(&l2, &s2);
    CURL *h = curl_easy_init();
    assert_non_null(h);
    int la = port_of(a, 0), pa = port_of(a, 1);
    int before = cg_noted();
    /* Its first request: not judged (a TLS handshake may leave records behind it). */
    assert_int_equal(cg_stale(h, "127.0.0.1", pa, la), 0);
    const int opened[] = {-1, other, a};
    cg_note_fresh(opened, 3, "127.0.0.1", pa, la);
    assert_int_equal(cg_noted(), before + 1);
    /* Its answer read, a byte nobody asked for: the next request refuses it, though no end
     * was noted. */
    assert_int_equal(write(s1, "x", 1), 1);
    struct pollfd p = {.fd = a, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 5000), 1);
    assert_int_equal(cg_stale(h, "127.0.0.1", pa, la), 1);
    assert_int_equal(cg_take_refused(h), 1);
    /* None of the opened sockets has the port: nothing is noted. */
    int lo = port_of(other, 0), po = port_of(other, 1);
    const int none[] = {a};
    cg_note_fresh(none, 1, "127.0.0.1", po, lo);
    assert_int_equal(cg_noted(), before + 1);
    cg_closesocket(NULL, a);
    cg_closesocket(NULL, other);
    assert_int_equal(cg_noted(), before);
    close(s1);
    close(s2);
    close(l1);
    close(l2);
    curl_easy_cleanup(h);
}

/* A noted socket closed without the close callback (libcurl 7.88 closes some that way), its
 * number then given to another connection: the other one is never judged by the first's note. */
static void test_a_socket_number_given_out_again_is_not_the_noted_connection(void **state)
{
    (void)state;
    int l1, s1;
    int a = connected(&l1, &s1);
    int la = port_of(a, 0), pa = port_of(a, 1);
    cg_note_use(a, "127.0.0.1", pa, la);
    CURL *h = curl_easy_init();
    assert_non_null(h);
    int number = a;
    close(a); /* behind the registry's back */
    int l2, s2;
    int b = connected(&l2, &s2);
    if (b != number) { /* the number is usually given out again at once; if not, place it */
        assert_int_equal(dup2(b, number), number);
        close(b);
        b = number;
    }
    /* Bytes wait on the new socket; the old note's addresses are asked for. The note is not
     * this socket's (another inode): a first exchange, not judged, and the note is dropped. */
    assert_int_equal(write(s2, "z", 1), 1);
    struct pollfd p = {.fd = b, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 5000), 1);
    int before = cg_noted();
    assert_int_equal(cg_stale(h, "127.0.0.1", pa, la), 0);
    assert_int_equal(cg_noted(), before - 1);
    assert_int_equal(cg_take_refused(h), 0);
    cg_closesocket(NULL, b);
    close(s1);
    close(s2);
    close(l1);
    close(l2);
    curl_easy_cleanup(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verdicts),
        cmocka_unit_test(test_bytes_waiting_refuse_a_used_connection),
        cmocka_unit_test(test_a_connection_is_told_apart_by_its_peer),
        cmocka_unit_test(test_a_connection_is_noted_from_its_first_request),
        cmocka_unit_test(test_a_socket_number_given_out_again_is_not_the_noted_connection),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
