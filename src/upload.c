#include "idemgate/upload.h"

#include "idemgate/policy.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t upl_select(const struct mp_part *parts, size_t n, long threshold, unsigned char *sel)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        /* Files only: a text field (a prompt) stays in the row, whatever its length — never
         * published to a store shared by every tenant that outlives the job. */
        sel[i] = threshold > 0 && parts[i].filename && parts[i].data_len > (size_t)threshold;
        k += sel[i];
    }
    return k;
}

size_t upl_refs_of(const char *body, const struct mp_part *parts, size_t n,
                   const unsigned char *sel, const char (*sha256s)[65], struct upl_ref *refs)
{
    size_t k = 0;
    /* mp_parse gives the parts in the order of the body. */
    for (size_t i = 0; i < n; i++) {
        if (!sel[i])
            continue;
        refs[k].offset = (size_t)(parts[i].data - body);
        refs[k].size = parts[i].data_len;
        memcpy(refs[k].sha256, sha256s[i], 65);
        refs[k].sha256[64] = '\0';
        k++;
    }
    return k;
}

/* refs ascending, not overlapping, each within len bytes. */
static int refs_fit(const struct upl_ref *refs, size_t n, size_t len)
{
    size_t end = 0;
    for (size_t i = 0; i < n; i++) {
        if (refs[i].offset < end || refs[i].size > len || refs[i].offset > len - refs[i].size)
            return 0;
        if (strlen(refs[i].sha256) != 64 || strspn(refs[i].sha256, "0123456789abcdef") != 64)
            return 0;
        end = refs[i].offset + refs[i].size;
    }
    return 1;
}

int upl_store_form(const char *body, size_t len, const struct upl_ref *refs, size_t n, char **out,
                   size_t *outlen)
{
    *out = NULL;
    *outlen = 0;
    if (!refs_fit(refs, n, len))
        return -1;
    size_t cut = 0;
    for (size_t i = 0; i < n; i++)
        cut += refs[i].size;
    /* A line is at most 20 + 1 + 20 + 1 + 64 + 1 bytes. */
    size_t cap = UPL_MAGIC_LEN + n * 110 + 1 + (len - cut) + 1;
    char *s = malloc(cap);
    if (!s)
        return -1;
    size_t pos = UPL_MAGIC_LEN;
    memcpy(s, UPL_MAGIC, UPL_MAGIC_LEN);
    for (size_t i = 0; i < n; i++)
        pos += (size_t)snprintf(s + pos, cap - pos, "%zu %zu %s\n", refs[i].offset, refs[i].size,
                                refs[i].sha256);
    s[pos++] = '\n';
    size_t from = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t to = i < n ? refs[i].offset : len;
        memcpy(s + pos, body + from, to - from);
        pos += to - from;
        if (i < n)
            from = refs[i].offset + refs[i].size;
    }
    *out = s;
    *outlen = pos;
    return 0;
}

int upl_is_stored_form(const char *stored, size_t len)
{
    return stored && len >= UPL_MAGIC_LEN && memcmp(stored, UPL_MAGIC, UPL_MAGIC_LEN) == 0;
}

/* A decimal number without sign or leading zero, ending at stop; advances *p past stop. */
static int read_num(const char **p, const char *end, char stop, size_t *v)
{
    const char *s = *p;
    size_t x = 0;
    if (s >= end || *s < '0' || *s > '9' || (*s == '0' && s + 1 < end && s[1] != stop))
        return -1;
    for (; s < end && *s >= '0' && *s <= '9'; s++) {
        if (x > (SIZE_MAX - 9) / 10)
            return -1;
        x = x * 10 + (size_t)(*s - '0');
    }
    if (s >= end || *s != stop)
        return -1;
    *v = x;
    *p = s + 1;
    return 0;
}

int upl_parse(const char *stored, size_t len, struct upl_ref *refs, size_t max, size_t *n,
              size_t *body_at, size_t *total, size_t max_total)
{
    *n = 0;
    if (!upl_is_stored_form(stored, len))
        return -1;
    const char *p = stored + UPL_MAGIC_LEN, *end = stored + len;
    size_t k = 0, cut = 0;
    while (p < end && *p != '\n') {
        if (k == max)
            return -1;
        struct upl_ref *r = &refs[k];
        if (read_num(&p, end, ' ', &r->offset) < 0 || read_num(&p, end, ' ', &r->size) < 0)
            return -1;
        if (end - p < 65 || p[64] != '\n' || strspn(p, "0123456789abcdef") < 64)
            return -1;
        memcpy(r->sha256, p, 64);
        r->sha256[64] = '\0';
        p += 65;
        if (r->size > max_total - cut)
            return -1;
        cut += r->size;
        k++;
    }
    if (p >= end || k == 0)
        return -1; /* no end of the table, or a table that names nothing */
    p++;
    size_t rest = (size_t)(end - p);
    if (rest > max_total - cut || !refs_fit(refs, k, rest + cut))
        return -1;
    *n = k;
    *body_at = (size_t)(p - stored);
    *total = rest + cut;
    return 0;
}

int upl_expand(const char *stored, size_t len, const struct upl_ref *refs, size_t n,
               size_t body_at, char *out, size_t total,
               int (*fetch)(void *arg, const struct upl_ref *ref, char *dst), void *arg)
{
    const char *cut = stored + body_at;
    size_t cut_len = len - body_at, from = 0, pos = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t to = i < n ? refs[i].offset : total;
        size_t take = to - pos; /* bytes of the cut body before this reference */
        if (from + take > cut_len)
            return -1;
        memcpy(out + pos, cut + from, take);
        from += take;
        pos = to;
        if (i == n)
            break;
        int e = fetch(arg, &refs[i], out + pos);
        if (e)
            return e;
        pos += refs[i].size;
    }
    return from == cut_len ? 0 : -1;
}

const char *upl_unread_reason(int rc)
{
    return rc == UPL_UNAVAILABLE ? "store_unavailable"
           : rc == UPL_MISSING   ? "object_missing"
                                 : "malformed";
}

enum op_state upl_resend_blocked(int rc)
{
    return rc == UPL_UNAVAILABLE || rc == UPL_MISSING ? ST_UNKNOWN : ST_REVIEW;
}

enum op_state upl_unread_next(enum upl_unread why, int ambiguous_before, long long since_first_ms,
                              long long deadline_ms)
{
    if (why == UPL_UNAVAILABLE || since_first_ms < deadline_ms)
        return ST_PREPARED;
    return pol_unsendable(ambiguous_before);
}
