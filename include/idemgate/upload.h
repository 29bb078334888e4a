#ifndef IDEMGATE_UPLOAD_H
#define IDEMGATE_UPLOAD_H

#include "idemgate/multipart.h"
#include "idemgate/states.h"

#include <stddef.h>

/* The stored form of an upload whose large parts are kept in the archive store (issue 25 §4): a
 * pure module, no I/O (uplstore.h does the store's side). A part whose content is longer than
 * upload_part_inline_bytes is published to the store under its SHA-256, and the row keeps the
 * client's body with that content cut out, behind a table that says what goes back where:
 *
 *     "idemgate-upload/1\n"
 *     "<offset> <size> <sha256>\n"       one line per part kept in the store, offsets ascending
 *     "\n"
 *     the client's body without those parts' contents (boundaries and part headers kept)
 *
 * offset is where the object's bytes stand in the client's body (decimal, no leading zero),
 * size their count, sha256 their lowercase hex SHA-256. The form is unambiguous: a stored JSON
 * body never begins with a letter and a stored multipart body begins with "--"; the table is
 * read strictly (every line, every number) and its references must not overlap nor fall beyond
 * the body. Expanding it gives the client's bytes exactly, boundary included. */

#define UPL_MAGIC "idemgate-upload/1\n"
#define UPL_MAGIC_LEN (sizeof(UPL_MAGIC) - 1)

struct upl_ref {
    size_t offset; /* in the client's body */
    size_t size;
    char sha256[65];
};

/* Which parts go to the store: sel[i] = 1 when parts[i] is a file (it has a filename) whose
 * content is longer than threshold (threshold <= 0: none goes); a text field, however long,
 * stays in the row. Returns how many were selected. */
size_t upl_select(const struct mp_part *parts, size_t n, long threshold, unsigned char *sel);

/* The references of the selected parts of body (parts point into it; sha256s[i] is the hex
 * digest of part i's content, read only where sel[i]) into refs (n of them at most): in the
 * order of the body. Returns how many. */
size_t upl_refs_of(const char *body, const struct mp_part *parts, size_t n,
                   const unsigned char *sel, const char (*sha256s)[65], struct upl_ref *refs);

/* The stored form of body[0..len) with the contents refs[0..n) names cut out (refs ascending,
 * inside body, not overlapping: as upl_refs_of gives them). malloc'ed into *out; 0, or -1 when
 * the references are not so or memory ran out. */
int upl_store_form(const char *body, size_t len, const struct upl_ref *refs, size_t n, char **out,
                   size_t *outlen);

/* 1 when stored[0..len) begins like a stored form (the magic line). */
int upl_is_stored_form(const char *stored, size_t len);

/* Reads a stored form: its references into refs (max of them), *n, where the cut body begins
 * (*body_at, within stored) and the length of the client's body (*total). 0, or -1 when it is
 * not a well-formed stored form, has more than max references, or its body would exceed
 * max_total bytes. */
int upl_parse(const char *stored, size_t len, struct upl_ref *refs, size_t max, size_t *n,
              size_t *body_at, size_t *total, size_t max_total);

/* The client's body from a stored form read by upl_parse, into out (total bytes): the cut body's
 * bytes, and for each reference fetch(arg, ref, dst) filling dst with its ref->size bytes.
 * Returns 0, or the first non-zero answer of fetch (nothing more is fetched). */
int upl_expand(const char *stored, size_t len, const struct upl_ref *refs, size_t n,
               size_t body_at, char *out, size_t total,
               int (*fetch)(void *arg, const struct upl_ref *ref, char *dst), void *arg);

/* Why an upload part could not be read back for a send (never 0, 1 or -1, which the readers'
 * other answers are). */
enum upl_unread {
    UPL_UNAVAILABLE = 2, /* the store could not be read (folder unreadable, bucket unreachable) */
    UPL_MISSING,         /* the store answered: no such object, or not the bytes recorded */
};

/* What follows a send that could not be made because a part could not be read back (nothing
 * was sent): `prepared` again (tried later by any replica) while the store is unavailable,
 * however long; an object the store says it lacks is waited for while the provider's retry
 * deadline (deadline_ms, counted like its retries from the first claim, since_first_ms) lasts —
 * an operator may restore it, or another replica share it — and after that the create can never
 * be sent as recorded: `failed` when no attempt was ever ambiguous (no task exists, nothing was
 * paid), else `unknown` (reconciliation looks for the task; it is never `failed`). */
enum op_state upl_unread_next(enum upl_unread why, int ambiguous_before, long long since_first_ms,
                              long long deadline_ms);

/* What follows a reconciler's resend of an in-doubt create that could not begin because its
 * upload could not be rebuilt (rc: ups_expand's UPL_UNAVAILABLE, UPL_MISSING or -1), known
 * before the resend counts a transport attempt: `unknown`, read again later — the store's outage
 * spends none of the job's attempts — or `review` for a stored body that can never be sent as
 * recorded (malformed). Never `failed`, never `prepared`: a task may exist. Pure. */
enum op_state upl_resend_blocked(int rc);

/* The name of why an upload could not be rebuilt (ups_expand's UPL_UNAVAILABLE, UPL_MISSING, or
 * -1: malformed), as logs and attempt rows say it. Pure. */
const char *upl_unread_reason(int rc);

#endif
