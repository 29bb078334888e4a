#ifndef IDEMGATE_FUZZ_PROFILE_H
#define IDEMGATE_FUZZ_PROFILE_H

/* Shared by the profile and configuration harnesses: a "profile" member names a file to read,
 * which is the operator's choice, not a parsing question. Fuzzing it would only read whatever
 * files the machine has (and /dev/stdin would block), so inputs whose entries name a profile
 * outside the profiles folder (an absolute path, or "..") are skipped; profiles inside it are
 * read and merged as in production. */

#include <cjson/cJSON.h>
#include <string.h>

/* 1 when every entry of the providers array arr names its profile, if any, by a plain relative
 * path (no leading '/', no ".."). */
static inline int fz_profiles_confined(const cJSON *arr)
{
    const cJSON *entry;
    cJSON_ArrayForEach(entry, arr)
    {
        const char *pf =
            cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(entry, "profile"));
        if (pf && (pf[0] == '/' || strstr(pf, "..")))
            return 0;
    }
    return 1;
}

#endif
