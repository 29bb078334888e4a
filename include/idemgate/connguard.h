#ifndef IDEMGATE_CONNGUARD_H
#define IDEMGATE_CONNGUARD_H

/* A kept-alive connection carries a request only while nothing is waiting on it.
 *
 * libcurl 7.88 reuses an idle HTTP/1.1 connection that has bytes waiting to be read (it drops
 * one only when its peer closed): bytes a provider or a proxy sent after an exchange ended — a
 * late 408, a second copy of an answer, the excess of a body longer than its length — are then
 * read as the answer to the next request sent on it. A create would take a stale status for its
 * own (a 429 that was never its answer: "not made", sent again, while the provider makes the
 * task the request did reach), and every later exchange on that connection would read the
 * answer of the one before: another job's result, perhaps another tenant's.
 *
 * Every connection is noted here from its first request on (cg_note_fresh, from the pre-request
 * callback of the transfer that opened it), and again when a transfer ends on a connection
 * libcurl keeps (cg_done: the socket, its addresses as libcurl reports them). Noted only at the
 * end, a connection could carry another request before the end was noted: libcurl runs a new
 * transfer due at once inside the same call that ends the last one on the connection, before
 * the engine reads the end. Just before a request leaves, its pre-request callback asks
 * cg_stale: on a connection noted before, a byte waiting, its peer's close or an error refuses the
 * sending (nothing has left), and the engine starts the transfer again on a new connection
 * (cg_take_refused). A connection never noted carries its first exchange: not judged (a TLS
 * handshake may leave records behind it). Over TLS, bytes OpenSSL has already read from the socket
 * into its own buffer (a record read whole while libcurl took only the answer's length from it)
 * are beyond a peek of the socket: the TLS session is asked too (SSL_has_pending). */

#include <curl/curl.h>
#include <sys/types.h>

/* What a connection about to carry a request shows. */
enum cg_verdict {
    CG_NEW = 0,     /* never noted: its first exchange (nothing to judge) */
    CG_CLEAN,       /* noted, nothing waiting */
    CG_INPUT,       /* noted, bytes waiting that no request of ours asked for */
    CG_PEER_CLOSED, /* noted, its peer closed it */
    CG_BROKEN,      /* noted, the socket reports an error */
};

/* The verdict for a connection, noted before or not, given what a non-blocking peek of one
 * byte returned (peeked), its errno (err, when peeked < 0) and whether its TLS session holds
 * bytes read from the socket and not yet taken (tls_pending). Pure. */
enum cg_verdict cg_judge(int noted, ssize_t peeked, int err, int tls_pending);

/* 1 when v refuses the sending. */
int cg_refuses(enum cg_verdict v);

/* After h's transfer ended (before it leaves its multi handle): the connection libcurl keeps
 * for the next one, if any, is noted with one more exchange carried. */
void cg_done(CURL *h);
/* The same, given the socket and its addresses (cg_done reads them from libcurl). */
void cg_note_use(int fd, const char *peer_ip, int peer_port, int local_port);
/* From the pre-request callback of a transfer that opened sockets (fds[0..n), as its
 * CURLOPT_SOCKOPTFUNCTION saw them): the one whose local port is local_port is the connection
 * about to carry its first request, noted now (after cg_stale, which does not judge it). */
void cg_note_fresh(const int *fds, int n, const char *peer_ip, int peer_port, int local_port);

/* CURLOPT_CLOSESOCKETFUNCTION: forgets the socket and closes it. */
int cg_closesocket(void *arg, curl_socket_t fd);
/* Sets CURLOPT_CLOSESOCKETFUNCTION on h. */
void cg_install(CURL *h);

/* From h's pre-request callback (its arguments): 1 when the connection must not carry h's
 * request; h is then remembered as refused (cg_take_refused) and counted. */
int cg_stale(CURL *h, const char *peer_ip, int peer_port, int local_port);

/* 1 (and h forgotten) when h's transfer ended because cg_stale refused its connection. */
int cg_take_refused(CURL *h);

/* Connections noted and not closed (for tests). */
int cg_noted(void);

#endif
