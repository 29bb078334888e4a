#include "idemgate/connguard.h"

#include "idemgate/log.h"
#include "idemgate/metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <stddef.h>
#include <unistd.h>

/* A registered socket, at index fd. Its addresses are learnt once, the first time a request is
 * about to leave on a connection nobody has looked up yet (a socket still connecting has no
 * peer: it is learnt later). */
struct sock {
    int registered;
    int learnt;
    int local_port, peer_port;
    char peer_ip[INET6_ADDRSTRLEN];
    int uses;      /* requests that left on it */
    int next_same; /* fd + 1 of the next learnt socket with this local port, 0: none */
    int next_new;  /* fd + 1 of the next socket not learnt yet, 0: none */
};

/* Transfers refused by cg_stale whose end the engine has not taken yet: a handful at most. */
#define REFUSED_MAX 64

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct sock *socks; /* by fd */
static int n_socks;        /* entries allocated */
static int registered;
static int by_port[65536]; /* fd + 1 of the first learnt socket with that local port */
static int unlearnt;       /* fd + 1 of the first socket not learnt yet */
static CURL *refused[REFUSED_MAX];
static int n_refused;

enum cg_verdict cg_judge(int uses_before, ssize_t peeked, int err)
{
    if (uses_before <= 0)
        return CG_NEW;
    if (peeked > 0)
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

/* Unlinks fd + 1 from the chain starting at *head (linked through the field at offset). */
static void unlink_from(int *head, int fd, size_t offset)
{
    for (int *p = head; *p; p = (int *)((char *)&socks[*p - 1] + offset)) {
        if (*p == fd + 1) {
            *p = *(int *)((char *)&socks[fd] + offset);
            return;
        }
    }
}

void cg_register(int fd)
{
    if (fd < 0)
        return;
    pthread_mutex_lock(&mu);
    if (fd >= n_socks) {
        int n = n_socks ? n_socks : 256;
        while (n <= fd)
            n *= 2;
        struct sock *s = realloc(socks, (size_t)n * sizeof(*s));
        if (!s) {
            /* Not registered: judged as a new connection at every use (libcurl's own rule). */
            pthread_mutex_unlock(&mu);
            return;
        }
        memset(s + n_socks, 0, (size_t)(n - n_socks) * sizeof(*s));
        socks = s;
        n_socks = n;
    }
    struct sock *k = &socks[fd];
    if (k->registered) {
        /* Closed without passing cg_closesocket: its number was given out again. */
        if (k->learnt)
            unlink_from(&by_port[k->local_port], fd, offsetof(struct sock, next_same));
        else
            unlink_from(&unlearnt, fd, offsetof(struct sock, next_new));
        registered--;
    }
    memset(k, 0, sizeof(*k));
    k->registered = 1;
    k->next_new = unlearnt;
    unlearnt = fd + 1;
    registered++;
    pthread_mutex_unlock(&mu);
}

int cg_closesocket(void *arg, curl_socket_t fd)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    if (fd >= 0 && fd < n_socks && socks[fd].registered) {
        struct sock *k = &socks[fd];
        if (k->learnt)
            unlink_from(&by_port[k->local_port], fd, offsetof(struct sock, next_same));
        else
            unlink_from(&unlearnt, fd, offsetof(struct sock, next_new));
        memset(k, 0, sizeof(*k));
        registered--;
    }
    pthread_mutex_unlock(&mu);
    return close(fd);
}

curl_socket_t cg_opensocket(void *arg, curlsocktype purpose, struct curl_sockaddr *a)
{
    (void)arg;
    (void)purpose;
    curl_socket_t fd = socket(a->family, a->socktype, a->protocol);
    cg_register(fd);
    return fd;
}

void cg_install(CURL *h, int own_opener)
{
    if (!own_opener)
        curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, cg_opensocket);
    curl_easy_setopt(h, CURLOPT_CLOSESOCKETFUNCTION, cg_closesocket);
}

static int port_of(const struct sockaddr_storage *ss, char *ip, size_t len)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const void *)ss;
        if (ip)
            inet_ntop(AF_INET, &a->sin_addr, ip, (socklen_t)len);
        return ntohs(a->sin_port);
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)ss;
        if (ip)
            inet_ntop(AF_INET6, &a->sin6_addr, ip, (socklen_t)len);
        return ntohs(a->sin6_port);
    }
    return -1;
}

/* Learns the addresses of every connected socket not learnt yet (under mu). */
static void learn(void)
{
    for (int *p = &unlearnt; *p;) {
        int fd = *p - 1;
        struct sock *k = &socks[fd];
        struct sockaddr_storage l, r;
        socklen_t ll = sizeof(l), rl = sizeof(r);
        if (getsockname(fd, (struct sockaddr *)&l, &ll) != 0 ||
            getpeername(fd, (struct sockaddr *)&r, &rl) != 0) {
            p = &k->next_new; /* still connecting (or not a socket we can place) */
            continue;
        }
        k->local_port = port_of(&l, NULL, 0);
        k->peer_port = port_of(&r, k->peer_ip, sizeof(k->peer_ip));
        *p = k->next_new; /* out of the new list */
        k->next_new = 0;
        if (k->local_port < 0 || k->local_port > 65535 || k->peer_port < 0) {
            /* Not TCP over IP: never looked up again. */
            k->local_port = 0;
            k->learnt = 0;
            continue;
        }
        k->learnt = 1;
        k->next_same = by_port[k->local_port];
        by_port[k->local_port] = fd + 1;
    }
}

static int find(const char *peer_ip, int peer_port, int local_port)
{
    if (local_port < 0 || local_port > 65535)
        return -1;
    for (int f = by_port[local_port]; f; f = socks[f - 1].next_same) {
        const struct sock *k = &socks[f - 1];
        if (k->peer_port == peer_port && strcmp(k->peer_ip, peer_ip) == 0)
            return f - 1;
    }
    return -1;
}

int cg_stale(CURL *h, const char *peer_ip, int peer_port, int local_port)
{
    peer_ip = peer_ip ? peer_ip : "";
    pthread_mutex_lock(&mu);
    int fd = find(peer_ip, peer_port, local_port);
    if (fd < 0 && unlearnt) {
        learn();
        fd = find(peer_ip, peer_port, local_port);
    }
    int uses = fd >= 0 ? socks[fd].uses : 0;
    pthread_mutex_unlock(&mu);
    if (fd < 0)
        return 0;
    ssize_t peeked = -1;
    int err = 0;
    if (uses > 0) {
        /* The one system call a reused connection costs; the socket is ours and idle (one
         * exchange at a time), so nothing else reads it meanwhile. */
        char b;
        peeked = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        err = errno;
    }
    enum cg_verdict v = cg_judge(uses, peeked, err);
    pthread_mutex_lock(&mu);
    int refuse = cg_refuses(v);
    if (!refuse)
        socks[fd].uses++;
    else if (n_refused < REFUSED_MAX)
        refused[n_refused++] = h; /* else refused all the same, not started again: not sent */
    pthread_mutex_unlock(&mu);
    if (refuse) {
        metrics_safety(MS_STALE_CONNECTION);
        LOG(LOG_WARN, "stale_connection_refused",
            LS("peer", peer_ip), LI("port", peer_port),
            LS("reason", v == CG_INPUT ? "bytes waiting" : v == CG_PEER_CLOSED ? "closed by peer"
                                                                               : "socket error"));
    }
    return refuse;
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

int cg_registered(void)
{
    pthread_mutex_lock(&mu);
    int n = registered;
    pthread_mutex_unlock(&mu);
    return n;
}
