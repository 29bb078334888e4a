#ifndef IDEMGATE_RESUME_H
#define IDEMGATE_RESUME_H

#include "idemgate/profile.h"

#include <stddef.h>

/* Resuming a cut stream the provider went on generating (issue 25 §3; PROVIDERS.md: an OpenAI
 * Responses stream created with "background": true resumes with GET
 * /v1/responses/{id}?stream=true&starting_after=<sequence_number>). The record a cut stream left
 * is kept up to its last whole event, and the resumed events are appended: the record stays the
 * one event sequence its live clients were given, completed. A pure module: no I/O. */

struct resume_point {
    long long after;   /* the sequence number of the last whole event recorded; -1: from the
                          start (nothing of this generation's stream is kept) */
    size_t prefix_len; /* the record's bytes through that event (its blank line included) */
};

/* Whether the cut stream of generation id (the job's remote id), asked by request req (its
 * body) and recorded as rec[0..rec_len) (may be empty), can be resumed with profile p's
 * reconcile.task.resume: the profile says how and the request's resume_when member is true.
 * Then, when the record is this generation's stream (it names id) and its last whole event
 * carries an integer sequence number at resume_sequence, it resumes after that event; else —
 * nothing kept (a replica killed before its first batch), nothing whole, or an earlier attempt's
 * answer — from the start, when the profile has resume.start_query. Returns 1 with *out filled,
 * 0 when it cannot be resumed (it is then read back whole), -1 when out of memory. */
int resume_point(const struct cfg_provider *p, const char *req, size_t req_len, const char *rec,
                 size_t rec_len, const char *id, struct resume_point *out);

/* How a cut stream's record rec[0..rec_len) of generation id ends, read with profile p's stream
 * format: RE_WHOLE when it is this generation's stream and holds its terminal event without an
 * error (the whole answer: the job is concluded from it, nothing resumed after its end — a
 * resume after the terminal event has no event to give, and the job was resumed every interval
 * until review); RE_FAILED when that terminal event is a failure (`response.failed`: the
 * provider's own status, read back whole, decides); RE_OPEN otherwise (nothing kept, another
 * generation's, or no terminal event: resumed). -1 when out of memory. */
enum resume_end { RE_OPEN = 0, RE_WHOLE = 1, RE_FAILED = 2 };
int resume_record_end(const struct cfg_provider *p, const char *rec, size_t rec_len,
                      const char *id);

/* The record after a resume: rec[0..pt->prefix_len) then the resumed answer's events. Returns a
 * malloc'ed buffer of *out_len bytes, or NULL when out of memory. */
char *resume_join(const char *rec, const struct resume_point *pt, const char *more,
                  size_t more_len, size_t *out_len);

/* Whether the bytes of a stream that arrived since the last batch kept on its row (`pending`, of
 * `noted` kept before) are to be kept now, `seconds` after that batch (or the call's start):
 * at most once a second, and only once they are at least 512 bytes and half of what is kept.
 * Each append rewrites the row's whole value, and what is kept grows by half at least each
 * time: all the writes of a stream together are under 3 times its size, and a stream of n
 * seconds is written about log1.5(n) times (1 000 streams of 30 s live: ~300 writes a second). */
int resume_note_due(size_t noted, size_t pending, double seconds);

/* A resume that gave no new event (curl_code and http_status of its call; stream_2xx: a 2xx
 * event stream without an error event, cut before its first new event; truncated: its answer
 * passed the profile's max_response_bytes): 1 when it is tried again later — the job stays
 * in doubt with its record — because the call failed, was cut, or was told "later" (408, 425,
 * 429, 5xx); 0 when the provider refused it (another status, or a 2xx that is no stream), or
 * when the stream is longer than the record may be (resumed again, it would be cut at the same
 * length, every interval until the window closed): the generation is then read back whole. Its
 * clients were given the record's events: the record must go on from them, never be replaced
 * while the stream can still be resumed. */
int resume_again_later(int curl_code, int http_status, int stream_2xx, int truncated);

#endif
