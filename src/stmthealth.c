#include "idemgate/stmthealth.h"

#include "idemgate/clock.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

static struct {
    pthread_mutex_t mu;
    atomic_int n; /* entries in use: sh_ok returns at once while 0 */
    struct {
        const char *stmt;
        char sqlstate[6];
        double at; /* clock_mono of the last failure */
    } e[SH_MAX];
} H = {.mu = PTHREAD_MUTEX_INITIALIZER};

int sh_sqlstate_counts(const char *s)
{
    static const char *const classes[] = {"0A", "42", "XX", "2F", "38", "39"};
    /* 42P05 (a prepared statement of that name exists) is a transaction pooler handing this
     * session another client's server connection, not a statement that cannot run. */
    if (!s || strlen(s) != 5 || !strcmp(s, "42P05"))
        return 0;
    for (size_t i = 0; i < sizeof(classes) / sizeof(classes[0]); i++)
        if (s[0] == classes[i][0] && s[1] == classes[i][1])
            return 1;
    return 0;
}

/* The entry of stmt, or -1. Under H.mu. */
static int find(const char *stmt)
{
    int n = atomic_load(&H.n);
    for (int i = 0; i < n; i++)
        if (H.e[i].stmt == stmt || !strcmp(H.e[i].stmt, stmt))
            return i;
    return -1;
}

/* Removes entry i. Under H.mu. */
static void drop(int i)
{
    int n = atomic_load(&H.n);
    H.e[i] = H.e[n - 1];
    atomic_store(&H.n, n - 1);
}

void sh_failed(const char *stmt, const char *sqlstate)
{
    sh_failed_at(stmt, sqlstate, clock_mono());
}

void sh_failed_at(const char *stmt, const char *sqlstate, double at)
{
    if (!stmt || !sh_sqlstate_counts(sqlstate))
        return;
    pthread_mutex_lock(&H.mu);
    int i = find(stmt);
    if (i < 0 && atomic_load(&H.n) < SH_MAX) {
        i = atomic_load(&H.n);
        H.e[i].stmt = stmt;
        atomic_store(&H.n, i + 1);
    }
    if (i >= 0) {
        memcpy(H.e[i].sqlstate, sqlstate, 5);
        H.e[i].sqlstate[5] = 0;
        H.e[i].at = at;
    }
    pthread_mutex_unlock(&H.mu);
}

void sh_ok(const char *stmt)
{
    if (atomic_load_explicit(&H.n, memory_order_relaxed) == 0 || !stmt)
        return;
    pthread_mutex_lock(&H.mu);
    int i = find(stmt);
    if (i >= 0)
        drop(i);
    pthread_mutex_unlock(&H.mu);
}

size_t sh_failing(void (*fn)(const char *, const char *, double, void *), void *arg)
{
    return sh_failing_at(clock_mono(), fn, arg);
}

size_t sh_failing_at(double now, void (*fn)(const char *, const char *, double, void *),
                     void *arg)
{
    size_t k = 0;
    pthread_mutex_lock(&H.mu);
    for (int i = 0; i < atomic_load(&H.n);) {
        double age = now - H.e[i].at;
        if (age > SH_WINDOW_S) {
            drop(i);
            continue;
        }
        if (fn)
            fn(H.e[i].stmt, H.e[i].sqlstate, age, arg);
        k++;
        i++;
    }
    pthread_mutex_unlock(&H.mu);
    return k;
}
