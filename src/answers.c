#include "idemgate/answers.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

/* The job cache's kind for these entries; the token is empty, as the job id alone names them. */
#define ANSWER_KIND 'w'
/* How long an answer is kept: its waiters are woken as it is put, and answer within
 * milliseconds; a job nobody waits for must not hold a cache slot (and a copy of its body) for
 * the cache's whole time to live. */
#define ANSWER_KEEP_MS 2000

void answers_put(const char *job_id, enum op_state st, int http_status, const char *resp_headers,
                 const void *body, size_t body_len)
{
    /* Only a success is answered from memory: an entry holds no job document, and a failed or
     * canceled job's answer says why (its last_error) — its waiters read it from the database
     * (before, they were told "job ended failed" without the provider's reason); a completed job
     * with no success kept is answered with its document, which is not here either. */
    if (!job_id || st != ST_COMPLETED || http_status < 200 || http_status >= 300 ||
        !resp_headers || !body || !body_len)
        return;
    struct jobcache_entry e;
    memset(&e, 0, sizeof(e));
    snprintf(e.job_id, sizeof(e.job_id), "%s", job_id);
    snprintf(e.state, sizeof(e.state), "%s", st_name(st));
    e.resp_status = http_status;
    /* The content type as reply.c reads it from the stored headers, with the same default. */
    snprintf(e.content_type, sizeof(e.content_type), "application/json");
    cJSON *h = cJSON_Parse(resp_headers);
    const char *ct = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(h, "content-type"));
    if (ct && strlen(ct) < sizeof(e.content_type))
        snprintf(e.content_type, sizeof(e.content_type), "%s", ct);
    cJSON_Delete(h);
    e.resp_body = (char *)body; /* copied by jobcache_put */
    e.resp_body_len = body_len;
    jobcache_put(ANSWER_KIND, "", job_id, &e, ANSWER_KEEP_MS);
}

int answers_get(const char *job_id, struct jobcache_entry *out)
{
    return jobcache_get(ANSWER_KIND, "", job_id, out);
}
