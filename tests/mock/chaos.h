/*
 * idemgate-mock: random mode, the mock half of the randomised fault campaign.
 *
 * POST /_chaos {"seed": INT, "weights": {BEHAVIOUR: WEIGHT, ...}, "lookup_delay_ms_max": INT}
 * turns it on.  Then every create that no source controls (no script entry, "_mock" key or
 * X-Mock-* header sets anything) draws one behaviour from a seeded PRNG (splitmix64), which
 * becomes that create's controls: the same seed and the same order of creates give the same
 * behaviours.  Lookups and lists wait a random time drawn from a second stream of the same
 * seed, so their timing never shifts the creates' sequence.  Draws are serialised by one
 * mutex.  The behaviours are rows of the table in chaos.c.
 */
#ifndef IDEMGATE_MOCK_CHAOS_H
#define IDEMGATE_MOCK_CHAOS_H

#include <stdbool.h>

#include <microhttpd.h>

#include "faults.h"
#include "mock.h"

/*
 * When random mode is on, draws a behaviour for a create whose controls *ctrl are empty,
 * fills *ctrl with it and returns its static name; returns NULL, leaving *ctrl alone, when
 * random mode is off.  async tells whether the personality is asynchronous: only then can a
 * task fail ("task_fails") and webhooks be duplicated, delayed or reordered.
 */
const char *chaos_draw(bool async, struct mock_controls *ctrl);

/* Returns how long a lookup or a list waits: 0..lookup_delay_ms_max, 0 when off. */
unsigned int chaos_lookup_delay_ms(void);

/* GET /_chaos: {"enabled", "seed", "weights", "lookup_delay_ms_max", "draws"}. */
enum MHD_Result chaos_handle_get(struct mock_request *req);

/* POST /_chaos: turns random mode on ({"seed": INT, ...}) or off ({"seed": null}). */
enum MHD_Result chaos_handle_post(struct mock_request *req);

/* Turns random mode off and forgets the draw counts (POST /_reset). */
void chaos_reset(void);

/* Checks the PRNG against known values; returns the failures and names each on stdout. */
int chaos_self_test(void);

#endif
