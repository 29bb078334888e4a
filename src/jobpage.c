#include "idemgate/jobpage.h"

#include <string.h>

const char *const jobpage_params[] = {"state", "provider", "idempotency_key", "limit",
                                      "starting_after", NULL};

/* "YYYY-MM-DDTHH:MM:SS.ffffffZ": digits where store_stamp writes digits. */
static int is_stamp(const char *s, size_t n)
{
    static const char shape[] = "dddd-dd-ddTdd:dd:dd.ddddddZ";
    if (n != sizeof(shape) - 1)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (shape[i] == 'd' ? (s[i] < '0' || s[i] > '9') : s[i] != shape[i])
            return 0;
    return 1;
}

/* A job id as crypto_job_id makes them, or any id of letters, digits and '_' up to 64. */
static int is_id(const char *s, size_t n)
{
    if (n == 0 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

int jobpage_past(int n, int limit, size_t bytes)
{
    return n >= limit || (n > 0 && bytes >= JOBPAGE_BODY_BYTES);
}

int jobpage_cursor(const char *stamp, const char *id, char out[JOBPAGE_CURSOR_LEN])
{
    if (!stamp || !id)
        return -1;
    size_t ns = strlen(stamp), ni = strlen(id);
    if (!is_stamp(stamp, ns) || !is_id(id, ni))
        return -1;
    memcpy(out, stamp, ns);
    out[ns] = '~';
    memcpy(out + ns + 1, id, ni + 1);
    return 0;
}

int jobpage_cursor_parse(const char *c, char stamp[28], char id[65])
{
    const char *sep = c ? strchr(c, '~') : NULL;
    if (!sep)
        return -1;
    size_t ns = (size_t)(sep - c), ni = strlen(sep + 1);
    if (!is_stamp(c, ns) || !is_id(sep + 1, ni))
        return -1;
    memcpy(stamp, c, ns);
    stamp[ns] = '\0';
    memcpy(id, sep + 1, ni + 1);
    return 0;
}
