#include "idemgate/usage.h"

#include "idemgate/pricing.h"
#include "idemgate/reply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const group_names[] = {"provider", "route", "day"};

const char *usage_group_name(enum usage_group g)
{
    return (unsigned)g < 3 ? group_names[g] : "provider";
}

/* n digits at s within [lo, hi]; the value in *v. */
static int digits(const char *s, int n, int lo, int hi, int *v)
{
    int x = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        x = x * 10 + (s[i] - '0');
    }
    *v = x;
    return x >= lo && x <= hi ? 0 : -1;
}

/* A date or an RFC 3339 timestamp, as usage_query_parse says. */
static int valid_time(const char *s)
{
    int y, mo, d, h, mi, se, oh, om;
    size_t len = strlen(s);
    if (len < 10 || digits(s, 4, 1, 9999, &y) || s[4] != '-' || digits(s + 5, 2, 1, 12, &mo) ||
        s[7] != '-' || digits(s + 8, 2, 1, 31, &d))
        return -1;
    static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (d > mdays[mo - 1] || (mo == 2 && d == 29 && !leap))
        return -1;
    if (len == 10)
        return 0;
    const char *p = s + 10;
    if ((*p != 'T' && *p != 't') || digits(p + 1, 2, 0, 23, &h) || p[3] != ':' ||
        digits(p + 4, 2, 0, 59, &mi) || p[6] != ':' || digits(p + 7, 2, 0, 59, &se))
        return -1;
    p += 9;
    if (*p == '.') {
        size_t n = strspn(p + 1, "0123456789");
        if (n < 1 || n > 9)
            return -1;
        p += 1 + n;
    }
    if ((*p == 'Z' || *p == 'z') && p[1] == '\0')
        return 0;
    if ((*p == '+' || *p == '-') && !digits(p + 1, 2, 0, 23, &oh) && p[3] == ':' &&
        !digits(p + 4, 2, 0, 59, &om) && p[6] == '\0')
        return 0;
    return -1;
}

int usage_query_parse(const char *from, const char *to, const char *group_by,
                      struct usage_query *q, char *err, size_t errlen)
{
    memset(q, 0, sizeof(*q));
    if ((from && valid_time(from) < 0) || (to && valid_time(to) < 0)) {
        snprintf(err, errlen, "from and to are dates (YYYY-MM-DD) or RFC 3339 timestamps");
        return -1;
    }
    q->from = from;
    q->to = to;
    if (!group_by)
        return 0;
    for (int g = 0; g < 3; g++)
        if (strcmp(group_by, group_names[g]) == 0) {
            q->group = (enum usage_group)g;
            return 0;
        }
    snprintf(err, errlen, "group_by is provider, route or day");
    return -1;
}

cJSON *usage_doc_new(const struct usage_query *q)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "object", "usage");
    if (q->from)
        cJSON_AddStringToObject(o, "from", q->from);
    else
        cJSON_AddNullToObject(o, "from");
    if (q->to)
        cJSON_AddStringToObject(o, "to", q->to);
    else
        cJSON_AddNullToObject(o, "to");
    cJSON_AddStringToObject(o, "group_by", usage_group_name(q->group));
    cJSON_AddArrayToObject(o, "data");
    cJSON_AddArrayToObject(o, "budgets");
    return o;
}

/* An amount as both integer micro-units and a decimal string ("0.120000"). */
static void add_amount(cJSON *o, const char *name, long long micros)
{
    char key[48], dec[32];
    if (micros < 0) {
        snprintf(key, sizeof(key), "%s_micros", name);
        cJSON_AddNullToObject(o, key);
        return;
    }
    snprintf(key, sizeof(key), "%s_micros", name);
    cJSON_AddNumberToObject(o, key, (double)micros);
    cJSON_AddStringToObject(o, name, price_format(micros, dec, sizeof(dec)));
}

void usage_add(const struct store_usage_row *row, void *arg)
{
    cJSON *doc = arg;
    cJSON *it = cJSON_CreateObject();
    if (!it)
        return;
    cJSON_AddStringToObject(it, "tenant", row->tenant);
    if (row->usage) {
        const char *g = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(doc, "group_by"));
        cJSON_AddStringToObject(it, g ? g : "provider", row->group ? row->group : "");
        cJSON_AddStringToObject(it, "currency", row->currency ? row->currency : "");
        cJSON_AddNumberToObject(it, "jobs", (double)row->v[0]);
        add_amount(it, "cost", row->v[1]);
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(doc, "data"), it);
        return;
    }
    if (row->currency)
        cJSON_AddStringToObject(it, "currency", row->currency);
    else
        cJSON_AddNullToObject(it, "currency");
    add_amount(it, "day_limit", row->v[0]);
    add_amount(it, "day_used", row->currency ? row->v[1] : -1);
    add_amount(it, "month_limit", row->v[2]);
    add_amount(it, "month_used", row->currency ? row->v[3] : -1);
    if (row->v[4] >= 0)
        cJSON_AddNumberToObject(it, "max_in_flight", (double)row->v[4]);
    else
        cJSON_AddNullToObject(it, "max_in_flight");
    if (row->currency)
        cJSON_AddNumberToObject(it, "in_flight", (double)row->v[5]);
    else
        cJSON_AddNullToObject(it, "in_flight");
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(doc, "budgets"), it);
}

void usage_get(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    char token[CRYPTO_SHA256_HEX], err[128];
    int admin = reply_is_admin(r);
    struct tenant t = {0};
    if (!admin && reply_caller_tenant(r, token, &t) < 0)
        return;
    struct usage_query q;
    if (usage_query_parse(hs_req_query(r, "from"), hs_req_query(r, "to"),
                          hs_req_query(r, "group_by"), &q, err, sizeof(err)) < 0) {
        reply_problem(r, 400, "invalid-query", "Invalid query", err, 0);
        return;
    }
    cJSON *doc = usage_doc_new(&q);
    if (!doc) {
        reply_problem(r, 500, "internal", "Internal error", "out of memory", 0);
        return;
    }
    int e = store_usage(api_db(r), admin ? 0 : t.id, NULL, q.from, q.to,
                        usage_group_name(q.group), usage_add, doc);
    if (e == STORE_EAUTH) {
        reply_unauthorized(r);
    } else if (e < 0) {
        reply_store_error(r, e);
    } else {
        reply_json(r, 200, doc);
        return;
    }
    cJSON_Delete(doc);
}
