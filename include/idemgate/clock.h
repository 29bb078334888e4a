#ifndef IDEMGATE_CLOCK_H
#define IDEMGATE_CLOCK_H

/* Time and randomness, in one place. Leases and fencing use the database's clock; these are for
 * local deadlines (monotonic), timestamps recorded with an attempt (wall) and jitter. */

/* Seconds on CLOCK_MONOTONIC (keeps counting while the process is stopped). */
double clock_mono(void);
/* Unix seconds on this host's clock. */
double clock_wall(void);
/* A uniform random number in [0, 1) from the system's CSPRNG (0.5 if it fails). */
double clock_rand01(void);
/* Sleeps ms milliseconds (restarted after a signal). */
void clock_sleep_ms(long ms);

#endif
