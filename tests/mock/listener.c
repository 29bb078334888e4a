/*
 * idemgate-mock: the listening socket, owned by the mock rather than by libmicrohttpd
 * (see listener.h).
 *
 * Only the thread in listener_run() touches the socket once it is open.  Connection
 * threads ask for a refuse window through refuse_lock and an eventfd that wakes the loop.
 */
#include "listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* How long accepting pauses after accept() ran out of descriptors or memory. */
#define ACCEPT_PAUSE_MS 50

/* How often binding again is retried when the port is briefly taken by someone else. */
#define REBIND_RETRY_MS 50

static int listen_fd = -1;

/* The most connections served at once (--threads), and how many were handed to
 * libmicrohttpd and not closed yet (listener_connection_closed counts the closes). It never
 * counts fewer than libmicrohttpd does, whose own count lags: a connection handed over is
 * started by its internal thread later. */
static unsigned int connection_limit = 1000;
static atomic_uint connections_live;
/* The address actually bound, port included, so a refuse window ends on the same one. */
static struct sockaddr_storage listen_addr;
static socklen_t listen_addr_len;
/* Readable when a connection thread has asked for a refuse window. */
static int wake_fd = -1;

static pthread_mutex_t refuse_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t refuse_cond = PTHREAD_COND_INITIALIZER;
static unsigned long refuse_requested; /* refuse requests made so far */
static unsigned long refuse_applied;   /* of those, the ones the loop has carried out */
static unsigned int refuse_ms;         /* the window of the newest request */
static bool loop_stopped;              /* the loop returned; nobody carries requests out */

/* Returns a monotonic clock reading in milliseconds. */
static long long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * Opens a non-blocking listening socket on addr.  SO_REUSEADDR lets the mock bind again
 * after a refuse window, and a test restart the mock, despite connections in TIME_WAIT.
 * Returns the socket, or -1 with errno set.
 */
static int bind_listener(const struct sockaddr *addr, socklen_t addr_len)
{
    int one = 1;
    int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return -1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, addr, addr_len) != 0 || listen(fd, SOMAXCONN) != 0) {
        int saved = errno;

        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

/* Returns the port of an IPv4 or IPv6 socket address. */
static unsigned int address_port(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)(const void *)ss)->sin6_port);
    return ntohs(((const struct sockaddr_in *)(const void *)ss)->sin_port);
}

/*
 * Resolves host and port (numeric; "0" picks a free port), preferring IPv4 when a name has
 * both kinds, and starts listening there.  Stores the port actually bound in *bound_port.
 * Returns false after printing why on stderr.
 */
bool listener_open(const char *host, const char *port, unsigned int *bound_port)
{
    struct addrinfo hints = {0}, *res, *pick = NULL;
    int rc;

    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "idemgate-mock: cannot resolve %s: %s\n", host, gai_strerror(rc));
        return false;
    }
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET) {
            pick = ai;
            break;
        }
        if (ai->ai_family == AF_INET6 && pick == NULL)
            pick = ai;
    }
    if (pick == NULL) {
        fprintf(stderr, "idemgate-mock: no IPv4 or IPv6 address for %s\n", host);
        freeaddrinfo(res);
        return false;
    }
    listen_fd = bind_listener(pick->ai_addr, pick->ai_addrlen);
    freeaddrinfo(res);
    listen_addr_len = sizeof(listen_addr);
    if (listen_fd < 0 ||
        getsockname(listen_fd, (struct sockaddr *)&listen_addr, &listen_addr_len) != 0) {
        fprintf(stderr, "idemgate-mock: cannot listen on %s:%s: %s\n", host, port, strerror(errno));
        listener_close();
        return false;
    }
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd < 0) {
        fprintf(stderr, "idemgate-mock: eventfd: %s\n", strerror(errno));
        listener_close();
        return false;
    }
    *bound_port = address_port(&listen_addr);
    return true;
}

/*
 * Accepts every connection waiting on the listening socket and hands it to daemon.  When
 * accept() runs out of descriptors or memory, sets *pause_until so the loop waits a little
 * instead of spinning on a socket that stays readable.
 */
static void accept_pending(struct MHD_Daemon *daemon, long long *pause_until)
{
    for (;;) {
        struct sockaddr_storage peer;
        socklen_t peer_len = sizeof(peer);
        int fd =
            accept4(listen_fd, (struct sockaddr *)&peer, &peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN) {
                fprintf(stderr, "idemgate-mock: accept: %s\n", strerror(errno));
                *pause_until = now_ms() + ACCEPT_PAUSE_MS;
            }
            return;
        }
        /*
         * At the --threads limit the connection is closed here, never handed over:
         * libmicrohttpd 0.9.75 keeps a lock when MHD_add_connection meets its own limit, and
         * then serves nothing ever again (its limit is set above ours, so it never does).
         */
        if (atomic_load(&connections_live) >= connection_limit) {
            fprintf(stderr, "idemgate-mock: at the connection limit (%u): closing an inbound "
                            "connection\n", connection_limit);
            close(fd);
            continue;
        }
        /* libmicrohttpd owns the socket from here on; it closes it when it cannot serve it. */
        if (MHD_add_connection(daemon, fd, (const struct sockaddr *)&peer, peer_len) == MHD_YES)
            atomic_fetch_add(&connections_live, 1);
    }
}

void listener_set_limit(unsigned int limit)
{
    connection_limit = limit;
}

void listener_connection_closed(void)
{
    atomic_fetch_sub(&connections_live, 1);
}

/*
 * Carries out the newest refuse request, if any: serves the connections whose handshake
 * has completed, closes the listening socket, sets *reopen_at to the end of the window
 * and tells the requesting threads that the socket is closed.
 */
static void apply_refuse(struct MHD_Daemon *daemon, long long *reopen_at)
{
    uint64_t count;
    unsigned long id;
    unsigned int ms;
    long long unused_pause = 0;

    if (read(wake_fd, &count, sizeof(count)) < 0 && errno != EAGAIN)
        fprintf(stderr, "idemgate-mock: eventfd read: %s\n", strerror(errno));
    pthread_mutex_lock(&refuse_lock);
    id = refuse_requested;
    ms = refuse_ms;
    pthread_mutex_unlock(&refuse_lock);
    if (id == refuse_applied)
        return;

    if (listen_fd >= 0) {
        /*
         * The kernel completes handshakes on its own, and closing the socket would reset
         * those connections; they are in progress, so they are served instead.
         */
        accept_pending(daemon, &unused_pause);
        close(listen_fd);
        listen_fd = -1;
        fprintf(stderr, "idemgate-mock: refusing connections for %u ms\n", ms);
    } else {
        fprintf(stderr, "idemgate-mock: refusing connections for %u ms from now\n", ms);
    }
    *reopen_at = now_ms() + ms;

    pthread_mutex_lock(&refuse_lock);
    refuse_applied = id;
    pthread_cond_broadcast(&refuse_cond);
    pthread_mutex_unlock(&refuse_lock);
}

/*
 * Binds and listens again on the original address once a refuse window is over.  Returns
 * false when that failed (another socket took the port meanwhile); the loop then retries.
 * *warned keeps the failure to one log line per window.
 */
static bool reopen_listener(bool *warned)
{
    listen_fd = bind_listener((const struct sockaddr *)&listen_addr, listen_addr_len);
    if (listen_fd < 0) {
        if (!*warned)
            fprintf(stderr, "idemgate-mock: cannot listen again on port %u: %s; retrying\n",
                    address_port(&listen_addr), strerror(errno));
        *warned = true;
        return false;
    }
    *warned = false;
    fprintf(stderr, "idemgate-mock: accepting connections again\n");
    return true;
}

/*
 * Accepts connections into daemon until one of stop_signals arrives (they must be blocked
 * in every thread) and returns its number.  Runs the /_refuse windows as well.  Call it
 * from one thread only, after listener_open().
 */
int listener_run(struct MHD_Daemon *daemon, const sigset_t *stop_signals)
{
    int sig_fd = signalfd(-1, stop_signals, SFD_CLOEXEC);
    long long reopen_at = 0, pause_until = 0;
    bool rebind_warned = false;
    int sig = 0;

    if (sig_fd < 0) {
        fprintf(stderr, "idemgate-mock: signalfd: %s\n", strerror(errno));
        sig = SIGTERM;
    }
    while (sig == 0) {
        struct pollfd pfd[3] = {
            {.fd = sig_fd, .events = POLLIN},
            {.fd = wake_fd, .events = POLLIN},
            {.fd = -1, .events = POLLIN},
        };
        long long now = now_ms();
        int timeout = -1;

        /* Without a socket to watch, the loop wakes when the window or the pause ends. */
        if (listen_fd >= 0 && now >= pause_until)
            pfd[2].fd = listen_fd;
        else if (listen_fd >= 0)
            timeout = (int)(pause_until - now);
        else
            timeout = reopen_at > now ? (int)(reopen_at - now) : 0;
        if (poll(pfd, 3, timeout) < 0 && errno != EINTR) {
            fprintf(stderr, "idemgate-mock: poll: %s\n", strerror(errno));
            continue;
        }
        if (pfd[0].revents & POLLIN) {
            struct signalfd_siginfo si;

            if (read(sig_fd, &si, sizeof(si)) == (ssize_t)sizeof(si))
                sig = (int)si.ssi_signo;
            continue;
        }
        /* Connections that reached the socket before a refuse request are served first. */
        if (pfd[2].revents)
            accept_pending(daemon, &pause_until);
        if (pfd[1].revents & POLLIN)
            apply_refuse(daemon, &reopen_at);
        if (listen_fd < 0 && now_ms() >= reopen_at && !reopen_listener(&rebind_warned))
            reopen_at = now_ms() + REBIND_RETRY_MS;
    }

    pthread_mutex_lock(&refuse_lock);
    loop_stopped = true;
    pthread_cond_broadcast(&refuse_cond);
    pthread_mutex_unlock(&refuse_lock);
    if (sig_fd >= 0)
        close(sig_fd);
    return sig;
}

/*
 * Closes the listening socket for ms milliseconds (1..LISTENER_REFUSE_MAX_MS); during a
 * window, makes it end ms from now instead.  Returns once the socket is closed, so the caller
 * can answer knowing that new connections are already refused; returns false when the
 * mock is shutting down instead.  Safe from any connection thread.
 */
bool listener_refuse(unsigned int ms)
{
    const uint64_t one = 1;
    unsigned long id;
    bool applied;

    pthread_mutex_lock(&refuse_lock);
    id = ++refuse_requested;
    refuse_ms = ms;
    pthread_mutex_unlock(&refuse_lock);

    if (write(wake_fd, &one, sizeof(one)) < 0)
        fprintf(stderr, "idemgate-mock: eventfd write: %s\n", strerror(errno));

    pthread_mutex_lock(&refuse_lock);
    while (refuse_applied < id && !loop_stopped)
        pthread_cond_wait(&refuse_cond, &refuse_lock);
    applied = refuse_applied >= id;
    pthread_mutex_unlock(&refuse_lock);
    return applied;
}

/* Closes the listening socket, if open, and frees the listener's resources. */
void listener_close(void)
{
    if (listen_fd >= 0)
        close(listen_fd);
    if (wake_fd >= 0)
        close(wake_fd);
    listen_fd = wake_fd = -1;
}
