#ifndef IDEMGATE_CREDWATCH_H
#define IDEMGATE_CREDWATCH_H

/* Whether each configured provider's credential can be read on this replica, as the dispatcher
 * asks before it takes one of that provider's creates: a claim, or a row recorded born reserved
 * at intake. A replica whose environment lacks a provider's secret (its variable unset, its file
 * not mounted yet) leaves that provider's jobs `prepared` for the replicas that have it, instead
 * of claiming each and giving it back — which counted a transport attempt and a first send that
 * never happened, every few seconds, against the job's retry budget and recovery window.
 *
 * What was read is kept CW_RECHECK_MS, then read again by the first caller (the others go on
 * with what was kept); every change is logged once, with the provider's name and the reason —
 * never the secret. A provider without a credential is always sendable. Safe from any thread. */

#define CW_RECHECK_MS 1000

struct cfg;
struct credwatch;

/* One slot per provider of cfg (in its order). NULL: out of memory. */
struct credwatch *cw_new(const struct cfg *cfg);
void cw_free(struct credwatch *w);

/* Whether provider i's credential was readable when last read (read again when stale, at
 * now_ms on the monotonic clock). An index out of range, or w NULL, is sendable. */
int cw_sendable(struct credwatch *w, int i, double now_ms);

/* Reads provider i's credential again now (a send found it unusable: the claims stop at once
 * rather than at the next recheck). */
void cw_recheck(struct credwatch *w, int i, double now_ms);

/* What a read of a credential says (pure: secret is what secret_get gave, or NULL). */
enum cw_verdict { CW_USABLE, CW_UNSET, CW_CONTROL_CHARACTER };
enum cw_verdict cw_judge(const char *credential_ref, const char *secret);

/* The message of a verdict, as the dispatcher's release once wrote it; NULL for CW_USABLE. */
const char *cw_reason(enum cw_verdict v);

/* Whether a slot last read at read_ms is read again at now_ms (pure). Never read: yes. */
int cw_stale(double read_ms, double now_ms);

#endif
