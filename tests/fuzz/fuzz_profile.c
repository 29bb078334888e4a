/* libFuzzer harness: provider profile loading (src/profile.c), the providers array of the
 * configuration as JSON: a profile file merged with the entry's own members, every field
 * validated, JSONPaths compiled, templates checked, the body-hint regex compiled.
 *
 * Input: a JSON object (one entry) or array (the providers array). Entries may name a profile
 * in deploy/providers/ ("profile": "replicate.json"). Properties checked:
 * - a refusal writes a NUL-terminated message that names the file;
 * - a loaded provider has a valid name and an http(s) base URL without a trailing '/', its
 *   timeouts in order, and a body hint only when compiled;
 * - loading is deterministic: the same input loads (or fails) the same way twice. */
#include "fuzz.h"
#include "fuzz_profile.h"

#include "idemgate/profile.h"

#ifndef IG_FUZZ_PROFILES
#error "IG_FUZZ_PROFILES must name the folder of provider profiles"
#endif

static void check_loaded(const struct cfg_provider *ps, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct cfg_provider *p = &ps[i];
        FZ_CHECK(p->name && *p->name &&
                     strspn(p->name, "abcdefghijklmnopqrstuvwxyz0123456789-_") == strlen(p->name),
                 "a provider name is [a-z0-9_-]+");
        FZ_CHECK(p->base_url && (!strncmp(p->base_url, "http://", 7) ||
                                 !strncmp(p->base_url, "https://", 8)),
                 "an http(s) base URL");
        size_t bl = strlen(p->base_url);
        FZ_CHECK(bl && p->base_url[bl - 1] != '/', "no trailing slash");
        FZ_CHECK(p->connect_timeout_ms >= 1 && p->total_timeout_ms >= p->connect_timeout_ms,
                 "timeouts in order");
        FZ_CHECK(p->mode == CFG_MODE_SYNC || p->mode == CFG_MODE_ASYNC_POLL, "a known mode");
        FZ_CHECK(p->n_not_created >= 0 && p->n_not_created <= 16 && p->n_trip_statuses >= 0 &&
                     p->n_trip_statuses <= 8 && p->n_accepted_statuses <= 8,
                 "status lists within their arrays");
        FZ_CHECK(p->profile_id != NULL, "a profile id");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cJSON *root = cJSON_ParseWithLength((const char *)data, size);
    if (!root)
        return 0;
    cJSON *arr = root;
    if (cJSON_IsObject(root)) {
        arr = cJSON_CreateArray();
        cJSON_AddItemToArray(arr, root);
    }
    if (fz_profiles_confined(arr)) {
        struct cfg_provider *ps = NULL, *ps2 = NULL;
        size_t n = 0, n2 = 0;
        char err[512] = "", err2[512] = "";
        int rc = prof_load_all(arr, "fuzz.json", IG_FUZZ_PROFILES, &ps, &n, err, sizeof(err));
        int rc2 = prof_load_all(arr, "fuzz.json", IG_FUZZ_PROFILES, &ps2, &n2, err2,
                                sizeof(err2));
        FZ_CHECK(rc == rc2 && n == n2 && strcmp(err, err2) == 0, "loading is deterministic");
        if (rc == 0)
            check_loaded(ps, n);
        else
            FZ_CHECK(memchr(err, '\0', sizeof(err)) && (!*err || strstr(err, "fuzz.json") ||
                                                        strstr(err, IG_FUZZ_PROFILES)),
                     "a refusal names the file");
        if (ps)
            prof_free_all(ps, n);
        if (ps2)
            prof_free_all(ps2, n2);
    }
    cJSON_Delete(arr);
    return 0;
}
