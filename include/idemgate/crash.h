#ifndef IDEMGATE_CRASH_H
#define IDEMGATE_CRASH_H

/* Crash points for the fault harness, compiled in only with -DIG_CRASHPOINTS=1 (test builds).
 * IDEMGATE_CRASH=name[:n] makes the process SIGKILL itself the n-th time (default 1st) it reaches
 * the point called name. IDEMGATE_PAUSE=name[:ms] makes the first thread that reaches it sleep ms
 * (default 1000) there, once: a window for a test to act in (a SIGTERM between a commit and what
 * follows it). In release builds CRASH_POINT() expands to nothing. */

#ifdef IG_CRASHPOINTS
void crash_point(const char *name);
#define CRASH_POINT(name) crash_point(name)
#else
#define CRASH_POINT(name) ((void)0)
#endif

#endif
