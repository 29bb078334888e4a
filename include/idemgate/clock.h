#ifndef IDEMGATE_CLOCK_H
#define IDEMGATE_CLOCK_H

/* Time and randomness, in one place. Leases and fencing use the database's clock; these are for
 * local deadlines (monotonic), timestamps recorded with an attempt (wall) and jitter. */

/* Seconds on CLOCK_BOOTTIME: monotonic, and it keeps counting while the process is stopped and
 * while the host is suspended (CLOCK_MONOTONIC does not count a suspend). */
double clock_mono(void);
/* Unix seconds on this host's clock. */
double clock_wall(void);
/* A uniform random number in [0, 1) from the system's CSPRNG (0.5 if it fails). */
double clock_rand01(void);
/* Sleeps ms milliseconds (restarted after a signal). */
void clock_sleep_ms(long ms);

/* A local deadline read on two clocks: an instant that must not be passed (the last moment a
 * request may start leaving under its lease). Passed once either clock says so — the monotonic
 * one, or this host's wall clock, which is set forward after a virtual machine was paused or a
 * host resumed, when the monotonic clock may not have counted the pause. A wall clock set
 * forward for another reason makes it pass early: the request is then not sent, never sent
 * late. */
struct clock_deadline {
    double mono;
    double wall;
};
/* The deadline `seconds` after mono_now / wall_now (two readings taken together). */
struct clock_deadline clock_deadline_in(double seconds, double mono_now, double wall_now);
/* 1 once the deadline has passed by either clock, else 0. Pure. */
int clock_deadline_passed(const struct clock_deadline *d, double mono_now, double wall_now);

#endif
