/*
 * idemgate-mock: shared request context and process-wide helpers.
 *
 * The mock provider is a test double for the paid generative-AI providers that idemgate
 * fronts.  Every file of the mock sees one request through a struct mock_request, which
 * mock.c fills in after the whole request body has been read.
 */
#ifndef IDEMGATE_MOCK_H
#define IDEMGATE_MOCK_H

#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

/*
 * One fully received HTTP request.  The strings belong to libmicrohttpd or to the
 * per-connection state in mock.c and stay valid until the handler returns.
 */
struct mock_request {
    struct MHD_Connection *conn;
    const char *method;
    const char *url;
    const char *body;
    size_t body_len;
    /* The status line that was queued, 0 when none was, so mock.c can log the outcome. */
    unsigned int log_status;
    /* The fault that was applied, NULL when none was, for the same log line. */
    const char *log_fault;
};

/* Returns true once SIGTERM or SIGINT has asked the process to stop. */
bool mock_shutting_down(void);

/*
 * Returns the base URL ("http://HOST:PORT", no trailing slash) that clients use to reach
 * this mock, for the file links inside create responses.
 */
const char *mock_base_url(void);

/* Returns the default create delay given by --delay-ms, in milliseconds. */
unsigned int mock_default_delay_ms(void);

/*
 * Sleeps for up to ms milliseconds in short steps so that a shutdown ends the sleep early.
 * When stop_on_disconnect is true, the sleep also ends as soon as the client has closed
 * its side of the connection.  Returns true when the full time elapsed, false when the
 * sleep was cut short.
 */
bool mock_sleep_ms(const struct mock_request *req, unsigned int ms, bool stop_on_disconnect);

#endif
