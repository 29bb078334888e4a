#ifndef IDEMGATE_LIVESTREAM_H
#define IDEMGATE_LIVESTREAM_H

#include <stddef.h>

struct hs_req;

/* The live copy of a create's event stream, for the clients of this replica that wait for it:
 * the first client of a streamed request (`"stream": true`, `Prefer: wait`) and any client that
 * joins it with the same key and body. The provider's events reach them as they arrive; what
 * the job records is the whole stream, written when the call ends (attempt.c), from which every
 * later replay is served.
 *
 * A live stream exists from the intake of a job born reserved on this replica until its first
 * attempt's result is recorded (or the reservation is given back): a retry after a refusal, or
 * an attempt on another replica, is not followed live (its clients wait for the job as any
 * other). Its bytes are kept in memory up to a share (ls_configure); a longer stream's bytes are
 * all moved to an unlinked file in the spool folder and read from there, memory keeping only
 * the event being received: what a live stream holds in memory does not grow with its length.
 * At most the provider's max_response_bytes are kept. The stream is the attempt's record too:
 * the transfer does not collect it a second time (attempt.c reads it with ls_record).
 *
 * Readers park (suspended, no thread blocked) until there is something for them: more bytes,
 * the stream's end, or the end of an attempt that never began streaming. Every wake-up happens
 * under the stream's lock, so a parked request is resumed exactly once and never after it was
 * unparked. */

struct ls;

/* Streams longer than memory_bytes (0: none) are spooled to unlinked files in dir (made, with
 * its parent, when missing; "" keeps /var/tmp). Before the first stream. */
void ls_configure(size_t memory_bytes, const char *dir);

/* Registers a live stream for job_id (replacing none: a second open of a live id returns the
 * same stream), at most max_bytes long, of format (an enum sse_format; SSE_NONE: events are
 * shown as they come). Of a known format, nothing is shown until an event carrying output
 * arrives: an error event before any output (a refusal the job backs off from) is shown only
 * when it is the job's record (ls_settle); otherwise the readers find a stream that never
 * began (ls_began 0, ls_read LS_NONE) and wait for the job. Returns a reference (ls_release),
 * or NULL when out of memory. */
struct ls *ls_open(const char *job_id, size_t max_bytes, int format);
/* The live stream of job_id, referenced, or NULL. */
struct ls *ls_find(const char *job_id);
/* The live stream of job_id, referenced and marked fed by the caller (the attempt that sends the
 * job here), or NULL — also when an attempt attached to it before: only a job's first attempt
 * feeds its live stream (a resend keeps its own body; the clients wait for the job). */
struct ls *ls_attach(const char *job_id);
/* Unregisters s, the stream its caller attached (if still registered): nothing more will be
 * fed; its readers are woken and read to its end. Never another attempt's stream of the job. */
void ls_close_own(struct ls *s);
/* Unregisters and ends job_id's stream unless an attempt attached to it: "nobody here sends it"
 * from whatever did not attach — the intake once its row was recorded for any replica, a born
 * reservation refused or given back, a claim not sent. This replica's dispatcher may have
 * claimed the job again meanwhile (a stale reservation's lease ran out), and the stream it
 * feeds is then its record: closed under it, the paid text was dropped and the job left in
 * doubt. */
void ls_close_unfed(const char *job_id);
void ls_release(struct ls *s);
/* One more reference to s. */
void ls_hold(struct ls *s);

/* The transfer's side (upstream.h's on_stream): a piece of the 2xx event stream. The first one
 * begins the stream. s is a struct ls. */
void ls_feed(void *s, const char *p, size_t n);
/* The transfer ended: a stream that began has ended (cut when it lacked its terminal event:
 * cut 1); one that never began lets its parked readers know the attempt is over. */
void ls_attempt_end(struct ls *s, int cut);

/* The result of the attempt that fed s was written as the job's end (recorded 1: completed,
 * failed or canceled with it) or not (0: not written, or written to be sent again or
 * reconciled). Until then the
 * stream's terminal event (`data: [DONE]`, `message_stop`, `response.completed`…) is held back
 * from its readers: a client is never given a whole answer that is not the job's record (a
 * result the database could not take — its lease then ran out — ends the readers cut, and
 * their retry finds the job as it is). */
void ls_settle(struct ls *s, int recorded);

/* What a reader finds at pos. */
enum ls_at {
    LS_BYTES = 0, /* bytes were copied */
    LS_WAIT,      /* nothing yet: park */
    LS_END,       /* the stream ended whole at pos */
    LS_CUT,       /* the stream ended without its terminal event (or past max_bytes) */
    LS_NONE,      /* it never began, and the attempt is over or the stream closed */
};
/* Copies up to max bytes from pos into buf (*n of them, when LS_BYTES). */
enum ls_at ls_read(struct ls *s, size_t pos, char *buf, size_t max, size_t *n);
/* The whole stream so far (malloc'ed, NUL-terminated, *len bytes); *whole is 0 when some bytes
 * the transfer offered were not kept (past max_bytes, out of memory or spool space): the record
 * is short. 0, or -1 when it cannot be read (out of memory, the spool file unreadable). */
int ls_record(struct ls *s, char **out, size_t *len, int *whole);
/* Bytes [off, off + n) of the stream into out. 0, or -1. */
int ls_copy(struct ls *s, size_t off, size_t n, char *out);
/* Streams whose bytes are in a spool file now (for the metrics and the tests). */
long ls_spooled(void);
/* 1 when the stream began (its first 2xx event-stream bytes arrived). */
int ls_began(struct ls *s);
/* 1 when it began for its readers: it began and, of a known format, output arrived or it is
 * the job's recorded end (ls_open). */
int ls_shown(struct ls *s);
/* Parks request r until something is there at pos (ls_read would not answer LS_WAIT), or until
 * deadline (CLOCK_MONOTONIC seconds; 0: none; not once the stream began, though nothing is
 * shown yet: it is the answer waited for) while the stream is registered: under the
 * stream's lock, r is suspended (hs_suspend) and registered, and returns 1; or, when something
 * is there already, returns 0 and r is not suspended; -1 when out of memory (not suspended). */
int ls_park(struct ls *s, struct hs_req *r, size_t pos, double deadline);
/* Takes r off s's parked readers (the request is over). */
void ls_unpark(struct ls *s, struct hs_req *r);

/* Resumes every parked reader now (shutting down: the server is quiesced, so a stream's reader
 * ends its body and a client waiting for one to begin is answered with the job). */
void ls_wake_all(void);

/* Live streams registered now (for the metrics and the tests). */
size_t ls_count(void);

#endif
