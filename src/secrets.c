#include "idemgate/secrets.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One secret file as last read: what identifies that version of it, and its content. */
struct sfile {
    char *path;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    char *value;
};

static struct {
    pthread_mutex_t mu;
    struct sfile *v;
    size_t n;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

size_t secret_trim(const char *s, size_t n)
{
    if (n && s[n - 1] == '\n') {
        n--;
        if (n && s[n - 1] == '\r')
            n--;
    }
    return n;
}

static void wipe_free(char *s, size_t n)
{
    if (!s)
        return;
    explicit_bzero(s, n);
    free(s);
}

void secret_free(char *s)
{
    if (s)
        wipe_free(s, strlen(s) + 1);
}

static int same_version(const struct sfile *f, const struct stat *st)
{
    return f->dev == st->st_dev && f->ino == st->st_ino && f->size == st->st_size &&
           f->mtime.tv_sec == st->st_mtim.tv_sec && f->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

/* Reads the file at path whole (at most SECRET_FILE_MAX bytes); its version into *st. */
static char *read_file(const char *path, struct stat *st)
{
    /* Never waits at the open: a FIFO or a device named by mistake is refused below (not a
     * regular file), not waited on by every thread that sends. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    char *buf = NULL;
    if (fstat(fd, st) == 0 && S_ISREG(st->st_mode) && st->st_size > 0 &&
        st->st_size <= SECRET_FILE_MAX && (buf = malloc((size_t)st->st_size + 1))) {
        size_t got = 0, want = (size_t)st->st_size;
        while (got < want) {
            ssize_t k = read(fd, buf + got, want - got);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                break;
            got += (size_t)k;
        }
        if (got != want) { /* shortened while read: the next call reads it again */
            wipe_free(buf, want + 1);
            buf = NULL;
        } else {
            size_t n = secret_trim(buf, got);
            for (size_t i = 0; i < n; i++)
                if (buf[i] == '\0')
                    buf[i] = '\x01'; /* a control character prov_secret_ok refuses */
            buf[n] = '\0';
        }
    }
    close(fd);
    return buf;
}

/* The slot of path in S (under S.mu): its entry, or a new empty one; NULL when out of memory. */
static struct sfile *slot_locked(const char *path)
{
    for (size_t i = 0; i < S.n; i++)
        if (strcmp(S.v[i].path, path) == 0)
            return &S.v[i];
    struct sfile *nv = realloc(S.v, (S.n + 1) * sizeof(*nv));
    if (!nv)
        return NULL;
    S.v = nv;
    char *p = strdup(path);
    if (!p)
        return NULL;
    S.v[S.n] = (struct sfile){.path = p};
    return &S.v[S.n++];
}

/* The file's content now: its last copy when it was not replaced since, else read again — the
 * read outside the lock, so that one slow file never holds the threads reading another. */
static char *file_secret(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return NULL;
    pthread_mutex_lock(&S.mu);
    struct sfile *f = slot_locked(path);
    if (f && f->value && same_version(f, &st)) {
        char *out = *f->value ? strdup(f->value) : NULL;
        pthread_mutex_unlock(&S.mu);
        return out;
    }
    pthread_mutex_unlock(&S.mu);
    char *value = read_file(path, &st); /* st: the version read (fstat of what was opened) */
    if (!value)
        return NULL;
    char *out = *value ? strdup(value) : NULL;
    pthread_mutex_lock(&S.mu);
    f = slot_locked(path);
    if (f) {
        secret_free(f->value);
        f->value = value;
        f->dev = st.st_dev;
        f->ino = st.st_ino;
        f->size = st.st_size;
        f->mtime = st.st_mtim;
        value = NULL;
    }
    pthread_mutex_unlock(&S.mu);
    secret_free(value); /* out of memory: read, not kept */
    return out;
}

int secret_is_file(const char *ref)
{
    return ref && strncmp(ref, SECRET_FILE_PREFIX, strlen(SECRET_FILE_PREFIX)) == 0;
}

const char *secret_name(const char *ref)
{
    return !ref ? "" : secret_is_file(ref) ? ref + strlen(SECRET_FILE_PREFIX) : ref;
}

char *secret_get(const char *ref)
{
    if (!ref || !*ref)
        return NULL;
    if (secret_is_file(ref))
        return file_secret(secret_name(ref));
    const char *v = getenv(ref);
    return v && *v ? strdup(v) : NULL;
}

void secrets_fini(void)
{
    pthread_mutex_lock(&S.mu);
    for (size_t i = 0; i < S.n; i++) {
        free(S.v[i].path);
        secret_free(S.v[i].value);
    }
    free(S.v);
    S.v = NULL;
    S.n = 0;
    pthread_mutex_unlock(&S.mu);
}
