#include "idemgate/connguard.h"

#include "idemgate/log.h"
#include "idemgate/metrics.h"

#include <errno.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* A noted connection, at index fd: its addresses as libcurl reports them, and the socket's
 * inode, which tells it from a later socket given the same number. */
struct sock {
    int noted;
    int local_port, peer_port;
    char peer_ip[INET6_ADDRSTRLEN];
    dev_t dev;
    ino_t ino;
    int next_same; /* fd + 1 of the next noted socket with this local port, 0: none */
};

/* Transfers refused by cg_stale whose end the engine has not taken yet: a handful at most. */
#define REFUSED_MAX 64

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct sock *socks; /* by fd */
static int n_socks;        /* entries allocated */
static int n_noted;
static int by_port[65536]; /* fd + 1 of the first noted socket with that local port */
static CURL *refused[REFUSED_MAX];
static int n_refused;

enum cg_verdict cg_judge(int noted, ssize_t peeked, int err, int tls_pending)
{
    if (!noted)
        return CG_NEW;
    if (peeked > 0 || tls_pending)
        return CG_INPUT;
    if (peeked == 0)
        return CG_PEER_CLOSED;
    if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR)
        return CG_CLEAN;
    return CG_BROKEN;
}

int cg_refuses(enum cg_verdict v)
{
    return v == CG_INPUT || v == CG_PEER_CLOSED || v == CG_BROKEN;
}

/* Forgets fd (under mu). */
static void forget(int fd)
{
    if (fd < 0 || fd >= n_socks || !socks[fd].noted)
        return;
    for (int *p = &by_port[socks[fd].local_port]; *p; p = &socks[*p - 1].next_same) {
        if (*p == fd + 1) {
            *p = socks[fd].next_same;
            break;
        }
    }
    memset(&socks[fd], 0, sizeof(socks[fd]));
    n_noted--;
}

/* 1 when fd's note is of the connection with these addresses (under mu). */
static int noted_as(int fd, const char *peer_ip, int peer_port, int local_port)
{
    const struct sock *k = fd < n_socks ? &socks[fd] : NULL;
    return k && k->noted && k->local_port == local_port && k->peer_port == peer_port &&
           strcmp(k->peer_ip, peer_ip) == 0;
}

void cg_note_use(int fd, const char *peer_ip, int peer_port, int local_port)
{
    if (fd < 0 || !peer_ip || local_port <= 0 || local_port > 65535)
        return;
    /* A connection noted before stays noted (cg_stale checks its inode before it is judged).
     * Else its inode is read once, here. */
    pthread_mutex_lock(&mu);
    int known = noted_as(fd, peer_ip, peer_port, local_port);
    pthread_mutex_unlock(&mu);
    if (known)
        return;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return;
    pthread_mutex_lock(&mu);
    if (fd >= n_socks) {
        int n = n_socks ? n_socks : 256;
        while (n <= fd)
            n *= 2;
        struct sock *s = realloc(socks, (size_t)n * sizeof(*s));
        if (!s) {
            /* Not noted: its next exchange is judged as a first one (libcurl's own rule). */
            pthread_mutex_unlock(&mu);
            return;
        }
        memset(s + n_socks, 0, (size_t)(n - n_socks) * sizeof(*s));
        socks = s;
        n_socks = n;
    }
    struct sock *k = &socks[fd];
    if (!noted_as(fd, peer_ip, peer_port, local_port) || k->dev != st.st_dev ||
        k->ino != st.st_ino) {
        forget(fd); /* a socket closed without our callback, its number given out again */
        k->noted = 1;
        k->local_port = local_port;
        k->peer_port = peer_port;
        snprintf(k->peer_ip, sizeof(k->peer_ip), "%s", peer_ip);
        k->dev = st.st_dev;
        k->ino = st.st_ino;
        k->next_same = by_port[local_port];
        by_port[local_port] = fd + 1;
        n_noted++;
    }
    pthread_mutex_unlock(&mu);
}

void cg_note_fresh(const int *fds, int n, const char *peer_ip, int peer_port, int local_port)
{
    for (int i = 0; i < n; i++) {
        struct sockaddr_storage a;
        socklen_t len = sizeof(a);
        if (fds[i] < 0 || getsockname(fds[i], (struct sockaddr *)&a, &len) != 0)
            continue;
        int port = a.ss_family == AF_INET    ? ntohs(((struct sockaddr_in *)&a)->sin_port)
                   : a.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&a)->sin6_port)
                                             : -1;
        if (port == local_port) {
            cg_note_use(fds[i], peer_ip, peer_port, local_port);
            return;
        }
    }
}

void cg_done(CURL *h)
{
    curl_socket_t fd = CURL_SOCKET_BAD;
    char *ip = NULL;
    long peer_port = 0, local_port = 0;
    /* The connection the transfer left in libcurl's cache, if it kept one. */
    if (curl_easy_getinfo(h, CURLINFO_ACTIVESOCKET, &fd) != CURLE_OK || fd == CURL_SOCKET_BAD)
        return;
    curl_easy_getinfo(h, CURLINFO_PRIMARY_IP, &ip);
    curl_easy_getinfo(h, CURLINFO_PRIMARY_PORT, &peer_port);
    curl_easy_getinfo(h, CURLINFO_LOCAL_PORT, &local_port);
    cg_note_use(fd, ip, (int)peer_port, (int)local_port);
}

int cg_closesocket(void *arg, curl_socket_t fd)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    forget(fd);
    pthread_mutex_unlock(&mu);
    return close(fd);
}

void cg_install(CURL *h)
{
    curl_easy_setopt(h, CURLOPT_CLOSESOCKETFUNCTION, cg_closesocket);
}

/* Whether the TLS session of h's connection holds bytes it read from the socket and nobody has
 * read from it yet: a record read whole while libcurl took only the answer's length from it (the
 * rest of a body longer than its length, an answer nobody asked for behind it). No peek of the
 * socket sees them. 0 for a connection without TLS, or with another TLS library. */
static int tls_pending(CURL *h)
{
    struct curl_tlssessioninfo *ti = NULL;
    if (curl_easy_getinfo(h, CURLINFO_TLS_SSL_PTR, &ti) != CURLE_OK || !ti || !ti->internals ||
        ti->backend != CURLSSLBACKEND_OPENSSL)
        return 0;
    return SSL_has_pending((SSL *)ti->internals);
}

int cg_stale(CURL *h, const char *peer_ip, int peer_port, int local_port)
{
    peer_ip = peer_ip ? peer_ip : "";
    int fd = -1;
    dev_t dev = 0;
    ino_t ino = 0;
    pthread_mutex_lock(&mu);
    if (local_port > 0 && local_port <= 65535) {
        for (int f = by_port[local_port]; f; f = socks[f - 1].next_same) {
            const struct sock *k = &socks[f - 1];
            if (k->peer_port == peer_port && strcmp(k->peer_ip, peer_ip) == 0) {
                fd = f - 1;
                dev = k->dev;
                ino = k->ino;
                break;
            }
        }
    }
    pthread_mutex_unlock(&mu);
    struct stat st;
    int noted_here = fd >= 0;
    if (noted_here && (fstat(fd, &st) != 0 || st.st_dev != dev || st.st_ino != ino)) {
        /* Not the socket that was noted (closed without our callback): this connection was
         * never noted itself. */
        pthread_mutex_lock(&mu);
        if (fd < n_socks && socks[fd].noted && socks[fd].ino == ino && socks[fd].dev == dev)
            forget(fd);
        pthread_mutex_unlock(&mu);
        noted_here = 0;
    }
    /* The socket is idle and ours (one exchange at a time): nothing else reads it meanwhile. */
    char b;
    ssize_t peeked = noted_here ? recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) : -1;
    int err = peeked < 0 ? errno : 0;
    enum cg_verdict v = cg_judge(noted_here, peeked, err, noted_here && tls_pending(h));
    if (!cg_refuses(v))
        return 0;
    pthread_mutex_lock(&mu);
    if (n_refused < REFUSED_MAX)
        refused[n_refused++] = h; /* else refused all the same, not started again: not sent */
    pthread_mutex_unlock(&mu);
    metrics_safety(MS_STALE_CONNECTION);
    LOG(LOG_WARN, "stale_connection_refused", LS("peer", peer_ip), LI("port", peer_port),
        LS("reason", v == CG_INPUT         ? "bytes waiting"
                     : v == CG_PEER_CLOSED ? "closed by peer"
                                           : "socket error"));
    return 1;
}

int cg_take_refused(CURL *h)
{
    int found = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_refused; i++) {
        if (refused[i] == h) {
            refused[i] = refused[--n_refused];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    return found;
}

int cg_noted(void)
{
    pthread_mutex_lock(&mu);
    int n = n_noted;
    pthread_mutex_unlock(&mu);
    return n;
}
