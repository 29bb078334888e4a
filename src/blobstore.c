#include "idemgate/blobstore.h"

#include "idemgate/clock.h"
#include "idemgate/crypto.h"
#include "idemgate/log.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define S3_TIMEOUT_MS 600000L
/* A PUT the bucket refused in passing is tried this many times in all, while each try answered
 * within S3_RETRY_WITHIN_S seconds. */
#define S3_PUT_TRIES 3
#define S3_RETRY_WITHIN_S 10.0
/* A request without a body signs the hash of the empty payload (S3 requires the header). */
#define EMPTY_SHA256_HEADER                                                                        \
    "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

struct blob_store {
    int s3;
    char *dir;
    char *endpoint, *bucket, *sigv4, *key_env, *secret_env;
    char host[128];
    /* The object folders (objects/00 … objects/ff) this store has made durable: made, and
     * objects/ fsynced since. A name published in one then needs its own folder's fsync only
     * (one flush a copy fewer). */
    _Atomic uint64_t durable_dirs[4];
};

/* The sequence number of temporary files, process-wide: several stores are open at once (the
 * archive's, a readiness probe's, each upload's), and two copies of one process must never be
 * given the same temporary name (O_EXCL would refuse the second). */
static atomic_ulong g_seq;

/* This process's run: its start instant in nanoseconds, in hex. Two processes with one pid (a
 * container's pid 1, restarted) never share it, so a sweep tells an earlier run's files from
 * its own. */
static char g_run[24];
static pthread_once_t g_run_once = PTHREAD_ONCE_INIT;

static void run_init(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(g_run, sizeof(g_run), "%llx",
             (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec);
}

static const char *run_token(void)
{
    pthread_once(&g_run_once, run_init);
    return g_run;
}

enum blob_tmp_owner blob_tmp_owner(const char *name, const char *host, long mypid,
                                   const char *myrun, long *pid)
{
    size_t hl = strlen(host);
    *pid = 0;
    if (strncmp(name, host, hl) != 0 || name[hl] != '.')
        return BLOB_TMP_OTHER_HOST;
    char *end = NULL;
    errno = 0;
    long p = strtol(name + hl + 1, &end, 10);
    if (errno || p <= 0 || end == name + hl + 1 || *end != '.')
        return BLOB_TMP_OTHER_HOST; /* not a name of ours: left alone */
    *pid = p;
    if (p != mypid)
        return BLOB_TMP_OTHER_PID;
    size_t rl = strlen(myrun);
    return strncmp(end + 1, myrun, rl) == 0 && end[1 + rl] == '.' ? BLOB_TMP_OURS
                                                                   : BLOB_TMP_EARLIER_RUN;
}

static char *dup0(const char *s)
{
    return strdup(s ? s : "");
}

struct blob_store *blob_open(const struct cfg *cfg)
{
    struct blob_store *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->s3 = strcmp(cfg->archive_backend, "s3") == 0;
    b->dir = dup0(cfg->archive_dir);
    b->endpoint = dup0(cfg->archive_s3_endpoint);
    b->bucket = dup0(cfg->archive_s3_bucket);
    b->key_env = dup0(cfg->archive_s3_access_key_env);
    b->secret_env = dup0(cfg->archive_s3_secret_key_env);
    char sig[160];
    snprintf(sig, sizeof(sig), "aws:amz:%s:s3", cfg->archive_s3_region);
    b->sigv4 = strdup(sig);
    size_t el = strlen(b->endpoint);
    if (el && b->endpoint[el - 1] == '/')
        b->endpoint[el - 1] = '\0';
    if (gethostname(b->host, sizeof(b->host) - 1) < 0 || !*b->host)
        snprintf(b->host, sizeof(b->host), "host");
    for (char *c = b->host; *c; c++)
        if (*c == '.' || *c == '/')
            *c = '_';
    if (!b->dir || !b->endpoint || !b->bucket || !b->key_env || !b->secret_env || !b->sigv4) {
        blob_close(b);
        return NULL;
    }
    return b;
}

void blob_close(struct blob_store *b)
{
    if (!b)
        return;
    free(b->dir);
    free(b->endpoint);
    free(b->bucket);
    free(b->sigv4);
    free(b->key_env);
    free(b->secret_env);
    free(b);
}

const char *blob_backend(const struct blob_store *b)
{
    return b->s3 ? "s3" : "local";
}

/* mkdir -p of path (its every component). */
static int mkdirs(const char *path)
{
    char tmp[1024];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0750) < 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    return mkdir(tmp, 0750) < 0 && errno != EEXIST ? -1 : 0;
}

static int fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int blob_tmp_open(struct blob_store *b, struct blob_tmp *t, char *why, size_t whylen)
{
    memset(t, 0, sizeof(*t));
    t->fd = -1;
    char dir[800];
    snprintf(dir, sizeof(dir), "%s/tmp", b->dir);
    if (mkdirs(dir) < 0) {
        snprintf(why, whylen, "archive folder %s: %s", dir, strerror(errno));
        return -1;
    }
    /* host.pid.run.seq names the copy's owner, so a sweep knows which ones are dead. */
    snprintf(t->path, sizeof(t->path), "%s/%s.%ld.%s.%lu", dir, b->host, (long)getpid(),
             run_token(), atomic_fetch_add(&g_seq, 1));
    t->fd = open(t->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
    t->md = EVP_MD_CTX_new();
    if (t->fd < 0 || !t->md || EVP_DigestInit_ex(t->md, EVP_sha256(), NULL) != 1) {
        snprintf(why, whylen, "temporary file: %s", strerror(errno));
        blob_tmp_abort(t);
        return -1;
    }
    return 0;
}

int blob_tmp_write(struct blob_tmp *t, const void *ptr, size_t len)
{
    const char *p = ptr;
    size_t left = len;
    while (left) {
        ssize_t w = write(t->fd, p, left);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    EVP_DigestUpdate(t->md, ptr, len);
    t->bytes += (long long)len;
    return 0;
}

void blob_tmp_abort(struct blob_tmp *t)
{
    if (t->fd >= 0) {
        close(t->fd);
        unlink(t->path);
    }
    t->fd = -1;
    EVP_MD_CTX_free(t->md);
    t->md = NULL;
}

static void hex(const unsigned char *d, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[2 * n] = '\0';
}

/* ---- local ---------------------------------------------------------------------------- */

static int local_publish(struct blob_store *b, struct blob_tmp *t, const char *sha, int *existed,
                         char *why, size_t whylen)
{
    char dir[800], path[1000];
    snprintf(dir, sizeof(dir), "%s/objects/%.2s", b->dir, sha);
    snprintf(path, sizeof(path), "%s/%s", dir, sha);
    char two[3] = {sha[0], sha[1], '\0'};
    unsigned slot = (unsigned)strtoul(two, NULL, 16) & 255; /* the folder's number */
    uint64_t bit = 1ULL << (slot & 63);
    _Atomic uint64_t *word = &b->durable_dirs[slot >> 6];
    int known = (atomic_load(word) & bit) != 0;
    if (!known && mkdirs(dir) < 0) {
        snprintf(why, whylen, "archive folder %s: %s", dir, strerror(errno));
        return -1;
    }
    struct stat st;
    if (stat(path, &st) == 0 && st.st_size == t->bytes &&
        utimensat(AT_FDCWD, path, NULL, 0) == 0) {
        /* Content-addressed: the same bytes are there already. Its time is made now: whoever
         * cleans the store deletes only objects older than a few minutes that no job names
         * (`idemgate unreferenced`), and one named again now is not old. (Deleted meanwhile,
         * it is published again below.) */
        *existed = 1;
        unlink(t->path);
        /* Its name made durable here too: the copy that published it may not have fsynced its
         * folder yet (or failed to), and this copy's row is committed `archived` on it. */
        char up[800];
        snprintf(up, sizeof(up), "%s/objects", b->dir);
        if (fsync_dir(dir) < 0 || (!known && fsync_dir(up) < 0)) {
            snprintf(why, whylen, "fsync of %s: %s", dir, strerror(errno));
            return -1;
        }
        return 0;
    }
    /* rename is atomic: the object is either absent or whole, never partial. */
    int rc = rename(t->path, path);
    if (rc < 0 && errno == ENOENT && known) { /* its folder went (removed by hand): made again */
        atomic_fetch_and(word, ~bit);
        known = 0;
        if (mkdirs(dir) == 0)
            rc = rename(t->path, path);
    }
    if (rc < 0) {
        snprintf(why, whylen, "publishing the object: %s", strerror(errno));
        return -1;
    }
    /* The new name is durable once its folder is; the folder's own entry once objects/ is —
     * fsynced the first time this store publishes into the folder, not at every copy. */
    char parent[800];
    snprintf(parent, sizeof(parent), "%s/objects", b->dir);
    /* Read again after the rename: another copy may have found the folder gone and made it
     * anew meanwhile (the bit cleared), its objects/ entry not yet durable. */
    if (known && !(atomic_load(word) & bit))
        known = 0;
    if (fsync_dir(dir) < 0 || (!known && fsync_dir(parent) < 0)) {
        snprintf(why, whylen, "fsync of %s: %s", dir, strerror(errno));
        return -1;
    }
    if (!known)
        atomic_fetch_or(word, bit);
    return 0;
}

/* ---- s3 ------------------------------------------------------------------------------- */

static size_t discard(char *p, size_t size, size_t n, void *arg)
{
    (void)p;
    (void)arg;
    return size * n;
}

static size_t to_fd(char *p, size_t size, size_t n, void *arg)
{
    int fd = *(int *)arg;
    size_t len = size * n, done = 0;
    while (done < len) {
        ssize_t w = write(fd, p + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return 0;
        done += (size_t)w;
    }
    return len;
}

/* A GET's body into a file, hashed as it comes (blob_open_read checks it against its name). */
struct hashed_fd {
    int fd;
    struct crypto_sha256 sha;
};

static size_t to_hashed_fd(char *p, size_t size, size_t n, void *arg)
{
    struct hashed_fd *hf = arg;
    size_t done = to_fd(p, size, n, &hf->fd);
    if (done)
        crypto_sha256_update(&hf->sha, p, done);
    return done;
}

/* A signed request on object key `key`; the caller adds what differs. NULL without credentials. */
static CURL *s3_handle(struct blob_store *b, const char *key_name, char *why, size_t whylen)
{
    const char *key = getenv(b->key_env), *secret = getenv(b->secret_env);
    if (!key || !secret) {
        snprintf(why, whylen, "the bucket's credentials are not in %s / %s", b->key_env,
                 b->secret_env);
        return NULL;
    }
    CURL *h = curl_easy_init();
    if (!h) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    char url[2048];
    snprintf(url, sizeof(url), "%s/%s/%s", b->endpoint, b->bucket, key_name);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, b->sigv4);
    curl_easy_setopt(h, CURLOPT_USERNAME, key);
    curl_easy_setopt(h, CURLOPT_PASSWORD, secret);
    curl_easy_setopt(h, CURLOPT_PROXY, "");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, S3_TIMEOUT_MS);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    return h;
}

/* The status of a finished request, or -1 (with why) when there was none. */
static long s3_perform(CURL *h, const char *what, char *why, size_t whylen)
{
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK) {
        snprintf(why, whylen, "bucket %s: %s", what, curl_easy_strerror(rc));
        return -1;
    }
    return status;
}

/* *status: the PUT's HTTP status, or 0 when there was none (a transport failure). */
static int s3_publish(struct blob_store *b, struct blob_tmp *t, const char *sha,
                      const char *content_type, int *existed, long *status, char *why,
                      size_t whylen)
{
    *status = 0;
    /* Always written, even when the same bytes are there (no HEAD first): the write makes the
     * object's time now, and whoever cleans the bucket deletes only objects older than a few
     * minutes that no job names (`idemgate unreferenced`) — one named again now is not old. */
    (void)existed;
    long st;
    CURL *h;
    FILE *f = fopen(t->path, "rb");
    if (!f) {
        snprintf(why, whylen, "reopening the copy: %s", strerror(errno));
        return -1;
    }
    h = s3_handle(b, sha, why, whylen);
    if (!h) {
        fclose(f);
        return -1;
    }
    /* The declared SHA-256 is signed and checked by the server: a PUT whose bytes differ fails,
     * and an interrupted PUT creates nothing. */
    char hsha[128], hct[300];
    snprintf(hsha, sizeof(hsha), "x-amz-content-sha256: %s", sha);
    snprintf(hct, sizeof(hct), "Content-Type: %s",
             content_type && *content_type ? content_type : "application/octet-stream");
    /* No "Expect:" line to remove libcurl's 100-continue: libcurl 7.88 names such a removal in
     * the SigV4 SignedHeaders although it sends no such header (curl #11664, fixed in 8.3), and
     * a server that checks the list refuses the PUT. The 100-continue it adds for a large body
     * is not signed, which S3 accepts. */
    struct curl_slist *hdrs = curl_slist_append(NULL, hsha);
    hdrs = curl_slist_append(hdrs, hct);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READDATA, f);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)t->bytes);
    st = s3_perform(h, "PUT", why, whylen);
    *status = st > 0 ? st : 0;
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    fclose(f);
    if (st < 200 || st > 299) {
        if (st > 0)
            snprintf(why, whylen, "bucket PUT answered %ld", st);
        return -1;
    }
    unlink(t->path);
    return 0;
}

int blob_tmp_commit(struct blob_store *b, struct blob_tmp *t, const char *content_type,
                    char sha[65], int *existed, char *why, size_t whylen)
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    *existed = 0;
    /* The bytes are durable before they get a name. */
    if (fsync(t->fd) < 0 || EVP_DigestFinal_ex(t->md, d, &dl) != 1) {
        snprintf(why, whylen, "fsync of the copy: %s", strerror(errno));
        blob_tmp_abort(t);
        return -1;
    }
    hex(d, dl, sha);
    close(t->fd);
    t->fd = -1;
    EVP_MD_CTX_free(t->md);
    t->md = NULL;
    if (!b->s3) {
        int rc = local_publish(b, t, sha, existed, why, whylen);
        if (rc < 0)
            unlink(t->path);
        return rc;
    }
    /* The bytes are in hand: a bucket's passing refusal (a 5xx, a 429 "slow down", a reset) is
     * tried again at once, a few times, before they are dropped — dropped, they must be fetched
     * again from a provider URL that may have expired meanwhile (the output lost). A PUT that
     * took long is not repeated here (the thread copies for others too): the copy is tried
     * again later, as any failure. */
    int rc = -1;
    for (int tries = 1;; tries++) {
        long status = 0;
        double t0 = clock_mono();
        rc = s3_publish(b, t, sha, content_type, existed, &status, why, whylen);
        int passing = status == 0 || status == 429 || status >= 500;
        if (rc == 0 || !passing || tries == S3_PUT_TRIES || clock_mono() - t0 > S3_RETRY_WITHIN_S)
            break;
        struct timespec pause = {0, 250L * 1000 * 1000 * tries};
        nanosleep(&pause, NULL);
    }
    if (rc < 0)
        unlink(t->path);
    return rc;
}

void blob_sweep(struct blob_store *b)
{
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/tmp", b->dir);
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    int swept = 0;
    while ((e = readdir(d))) {
        long pid = 0;
        enum blob_tmp_owner o = blob_tmp_owner(e->d_name, b->host, (long)getpid(), run_token(),
                                               &pid);
        if (o == BLOB_TMP_OTHER_HOST || o == BLOB_TMP_OURS)
            continue;
        if (o == BLOB_TMP_OTHER_PID && (kill((pid_t)pid, 0) == 0 || errno != ESRCH))
            continue;
        char path[1400];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (unlink(path) == 0)
            swept++;
    }
    closedir(d);
    if (swept)
        LOG(LOG_INFO, "archive_tmp_swept", LI("files", swept));
}

int blob_open_read(struct blob_store *b, const char *sha, int *fd, long long *size, char *why,
                   size_t whylen)
{
    *fd = -1;
    if (strlen(sha) != 64 || strspn(sha, "0123456789abcdef") != 64) {
        snprintf(why, whylen, "not a SHA-256");
        return -1;
    }
    if (!b->s3) {
        char path[1200];
        snprintf(path, sizeof(path), "%s/objects/%.2s/%s", b->dir, sha, sha);
        int f = open(path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (f < 0 || fstat(f, &st) < 0) {
            int missing = errno == ENOENT || errno == ENOTDIR;
            snprintf(why, whylen, "object missing from the archive: %s", strerror(errno));
            if (f >= 0)
                close(f);
            return missing ? BLOB_ENOENT : BLOB_EUNAVAIL;
        }
        *fd = f;
        *size = (long long)st.st_size;
        return 0;
    }
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/tmp", b->dir);
    if (mkdirs(dir) < 0) {
        snprintf(why, whylen, "archive folder %s: %s", dir, strerror(errno));
        return BLOB_EUNAVAIL;
    }
    /* An unnamed file: nothing to clean up whatever happens to this process. */
    int f = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (f < 0) {
        snprintf(why, whylen, "temporary file: %s", strerror(errno));
        return BLOB_EUNAVAIL;
    }
    CURL *h = s3_handle(b, sha, why, whylen);
    if (!h) {
        close(f);
        return BLOB_EUNAVAIL;
    }
    struct curl_slist *empty = curl_slist_append(NULL, EMPTY_SHA256_HEADER);
    struct hashed_fd hf = {.fd = f};
    if (crypto_sha256_begin(&hf.sha) < 0) {
        snprintf(why, whylen, "out of memory");
        curl_easy_cleanup(h);
        curl_slist_free_all(empty);
        close(f);
        return BLOB_EUNAVAIL;
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, empty);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, to_hashed_fd);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &hf);
    long st = s3_perform(h, "GET", why, whylen);
    curl_easy_cleanup(h);
    curl_slist_free_all(empty);
    uint8_t d[CRYPTO_SHA256_LEN];
    char got[CRYPTO_SHA256_HEX];
    crypto_sha256_end(&hf.sha, d);
    crypto_hex(d, sizeof(d), got);
    if (st != 200) {
        if (st > 0)
            snprintf(why, whylen, "bucket GET answered %ld", st);
        close(f);
        return st == 404 ? BLOB_ENOENT : BLOB_EUNAVAIL;
    }
    /* An object is named by its SHA-256: bytes that do not hash to the name (changed in the
     * bucket, or on the way over an http:// endpoint) are never served as it. */
    if (strcmp(got, sha) != 0) {
        snprintf(why, whylen, "the bucket's object does not match its SHA-256 (%.12s…)", got);
        close(f);
        return BLOB_EUNAVAIL;
    }
    *size = (long long)lseek(f, 0, SEEK_END);
    *fd = f;
    return 0;
}

/* ---- the writability probe ------------------------------------------------------------ */

#define PROBE_TIMEOUT_MS 5000L
#define PROBE_BODY "idemgate archive probe\n"

/* One signed request of the probe on key: a PUT of PROBE_BODY, or a DELETE. The status, or -1. */
static long s3_probe_call(struct blob_store *b, const char *key, int put, char *why, size_t whylen)
{
    CURL *h = s3_handle(b, key, why, whylen);
    if (!h)
        return -1;
    char sha[65], hsha[128];
    crypto_sha256_hex(put ? PROBE_BODY : "", put ? sizeof(PROBE_BODY) - 1 : 0, sha);
    snprintf(hsha, sizeof(hsha), "x-amz-content-sha256: %s", sha);
    struct curl_slist *hdrs = curl_slist_append(NULL, hsha); /* no "Expect:" (s3_publish) */
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, PROBE_TIMEOUT_MS);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, PROBE_TIMEOUT_MS);
    if (put) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PUT");
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, PROBE_BODY);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)(sizeof(PROBE_BODY) - 1));
    } else {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
    }
    long st = s3_perform(h, put ? "probe PUT" : "probe DELETE", why, whylen);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    if (st > 0 && (st < 200 || st > 299)) {
        snprintf(why, whylen, "bucket %s answered %ld", put ? "probe PUT" : "probe DELETE", st);
        return -1;
    }
    return st;
}

int blob_probe(struct blob_store *b, char *why, size_t whylen)
{
    /* Every copy is spooled in archive_dir/tmp first, whatever the backend. */
    struct blob_tmp t;
    if (blob_tmp_open(b, &t, why, whylen) < 0)
        return -1;
    if (blob_tmp_write(&t, PROBE_BODY, sizeof(PROBE_BODY) - 1) < 0 || fsync(t.fd) < 0) {
        snprintf(why, whylen, "writing in the archive folder: %s", strerror(errno));
        blob_tmp_abort(&t);
        return -1;
    }
    blob_tmp_abort(&t); /* closed and removed */
    if (!b->s3)
        return 0;
    /* Objects are named by their SHA-256 (64 hex digits): this key is never one of them. */
    char key[200];
    snprintf(key, sizeof(key), "idemgate-probe/%s.%ld", b->host, (long)getpid());
    if (s3_probe_call(b, key, 1, why, whylen) < 0)
        return -1;
    return s3_probe_call(b, key, 0, why, whylen) < 0 ? -1 : 0;
}
