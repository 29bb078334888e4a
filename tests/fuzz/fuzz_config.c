/* libFuzzer harness: configuration loading (src/config.c) from a file: the settings table (names,
 * types, bounds), the listen address, the cross-checks, and the providers array with its
 * profiles (profiles/"providers/x.json" resolve to deploy/providers/ through a link in the
 * harness's own temporary folder).
 *
 * Each input is written to that folder's idemgate.json and loaded with cfg_load. The
 * environment's IDEMGATE_* and DATABASE_URL variables are removed at start so that only the file
 * counts. Properties checked:
 * - a refusal returns NULL with a NUL-terminated message;
 * - a loaded configuration has its port in 0..65535, a log level of the four, an instance id,
 *   every setting within its bounds that the harness can see (threads, workers, depth), and a
 *   lease longer than every provider's total timeout by 2 s. */
#include "fuzz.h"
#include "fuzz_profile.h"

#include "idemgate/config.h"

#include <unistd.h>

#ifndef IG_FUZZ_PROFILES
#error "IG_FUZZ_PROFILES must name the folder of provider profiles"
#endif

extern char **environ;

static char dir[64], file[96];

static void cleanup(void)
{
    char link[96];
    snprintf(link, sizeof(link), "%s/providers", dir);
    unlink(file);
    unlink(link);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; *e; e++) {
            if (!strncmp(*e, "IDEMGATE_", 9) || !strncmp(*e, "DATABASE_URL=", 13)) {
                char name[128];
                size_t n = strcspn(*e, "=");
                snprintf(name, sizeof(name), "%.*s", (int)n, *e);
                unsetenv(name);
                again = 1;
                break;
            }
        }
    }
    snprintf(dir, sizeof(dir), "/tmp/idemgate-fuzz-config.XXXXXX");
    char link[96];
    if (!mkdtemp(dir))
        abort();
    snprintf(file, sizeof(file), "%s/idemgate.json", dir);
    snprintf(link, sizeof(link), "%s/providers", dir);
    if (symlink(IG_FUZZ_PROFILES, link) != 0)
        abort();
    atexit(cleanup);
    return 0;
}

static void check_loaded(const struct cfg *c)
{
    FZ_CHECK(c->listen_port >= 0 && c->listen_port <= 65535, "a port");
    FZ_CHECK(!strcmp(c->log_level, "debug") || !strcmp(c->log_level, "info") ||
                 !strcmp(c->log_level, "warn") || !strcmp(c->log_level, "error"),
             "a log level");
    FZ_CHECK(c->instance_id && *c->instance_id, "an instance id");
    FZ_CHECK(c->http_threads >= 1 && c->max_json_depth >= 1 && c->lease_seconds >= 1,
             "settings within bounds");
    for (size_t i = 0; i < c->n_providers; i++)
        FZ_CHECK(c->providers[i].total_timeout_ms + 2000 <= (long)c->lease_seconds * 1000,
                 "the lease outlives a call");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cJSON *root = cJSON_ParseWithLength((const char *)data, size);
    int confined = fz_profiles_confined(cJSON_GetObjectItemCaseSensitive(root, "providers"));
    cJSON_Delete(root);
    if (!confined)
        return 0;
    FILE *f = fopen(file, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
    char err[512];
    memset(err, 'x', sizeof(err));
    struct cfg *c = cfg_load(file, err, sizeof(err));
    if (c) {
        check_loaded(c);
        cfg_free(c);
    } else {
        FZ_CHECK(memchr(err, '\0', sizeof(err)) != NULL, "a refusal says why");
    }
    return 0;
}
