/*
 * idemgate-mock: the listening socket, owned by the mock rather than by libmicrohttpd.
 *
 * The main thread accepts connections itself and hands each one to the libmicrohttpd
 * daemon (started with MHD_USE_NO_LISTEN_SOCKET), which serves it on a thread of its own.
 * Owning the socket lets POST /_refuse really close it for a while, so that new clients get
 * ECONNREFUSED, and bind it again on the same address afterwards, without touching the
 * daemon or the connections it is serving.
 */
#ifndef IDEMGATE_MOCK_LISTENER_H
#define IDEMGATE_MOCK_LISTENER_H

#include <signal.h>
#include <stdbool.h>

#include <microhttpd.h>

/* Longest /_refuse window, in milliseconds. */
#define LISTENER_REFUSE_MAX_MS (600u * 1000u)

/*
 * Resolves host and port (numeric; "0" picks a free port), preferring IPv4 when a name has
 * both kinds, and starts listening there.  Stores the port actually bound in *bound_port.
 * Returns false after printing why on stderr.
 */
bool listener_open(const char *host, const char *port, unsigned int *bound_port);

/*
 * The most connections served at once: one more is closed as soon as it is accepted.  Call
 * it before listener_run(); give libmicrohttpd the higher limit LISTENER_MHD_LIMIT, which it
 * then never meets: its own count drops only when its polling thread cleans a closed
 * connection up, later than the close this listener counts, so after a thousand clients left
 * at once (a replica killed) it may count up to twice the limit for a moment.
 */
#define LISTENER_MHD_LIMIT(limit) ((limit) * 4u + 64u)
void listener_set_limit(unsigned int limit);

/* Counts a connection libmicrohttpd closed: its MHD_OPTION_NOTIFY_CONNECTION callback calls it
 * for MHD_CONNECTION_NOTIFY_CLOSED.  Safe from any thread. */
void listener_connection_closed(void);

/*
 * Accepts connections into daemon until one of stop_signals arrives (they must be blocked
 * in every thread) and returns its number.  Runs the /_refuse windows as well.  Call it
 * from one thread only, after listener_open().
 */
int listener_run(struct MHD_Daemon *daemon, const sigset_t *stop_signals);

/*
 * Closes the listening socket for ms milliseconds (1..LISTENER_REFUSE_MAX_MS); during a
 * window, makes it end ms from now instead.  Returns once the socket is closed, so the caller
 * can answer knowing that new connections are already refused; returns false when the
 * mock is shutting down instead.  Safe from any connection thread.
 */
bool listener_refuse(unsigned int ms);

/* Closes the listening socket, if open, and frees the listener's resources. */
void listener_close(void);

#endif
