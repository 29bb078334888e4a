#include "idemgate/problem.h"
#include "idemgate/utf8.h"

#include <stdio.h>
#include <string.h>

const char *problem_error_type(int status)
{
    switch (status) {
    case 401:
        return "authentication_error";
    case 402:
        return "insufficient_quota";
    case 403:
        return "permission_error";
    case 429:
        return "rate_limit_error";
    default:
        return status >= 400 && status < 500 ? "invalid_request_error" : "server_error";
    }
}

/* s as the inside of a JSON string, into out (at most max - 1 bytes, NUL-terminated): whole
 * characters only, so a cut never splits an escape or a UTF-8 sequence. Returns the length. */
static size_t escape(char *out, size_t max, const char *s)
{
    size_t pos = 0;
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    while (*p) {
        char unit[8];
        size_t ulen = 0, adv = 1;
        if (*p == '"' || *p == '\\') {
            unit[0] = '\\';
            unit[1] = (char)*p;
            ulen = 2;
        } else if (*p < 0x20 || *p == 0x7f) {
            ulen = (size_t)snprintf(unit, sizeof(unit), "\\u%04x", *p);
        } else if (*p < 0x80) {
            unit[0] = (char)*p;
            ulen = 1;
        } else if ((adv = utf8_seq(p, 4)) > 0) {
            memcpy(unit, p, adv);
            ulen = adv;
        } else {
            memcpy(unit, "\\ufffd", 6);
            ulen = 6;
            adv = 1;
        }
        if (pos + ulen >= max)
            break;
        memcpy(out + pos, unit, ulen);
        pos += ulen;
        p += adv;
    }
    out[pos] = '\0';
    return pos;
}

size_t problem_render(const struct problem *p, char *out, size_t cap)
{
    char type[PROBLEM_TYPE_MAX], title[PROBLEM_TITLE_MAX], detail[PROBLEM_DETAIL_MAX],
        rid[PROBLEM_REQUEST_ID_MAX];
    if (!out || cap < PROBLEM_BODY_MAX) {
        if (out && cap)
            out[0] = '\0';
        return 0;
    }
    escape(type, sizeof(type), p->type);
    escape(title, sizeof(title), p->title);
    escape(detail, sizeof(detail), p->detail ? p->detail : p->title);
    escape(rid, sizeof(rid), p->request_id);
    /* The message an SDK shows as "<status> <message>": the title says what, the detail why. */
    int title_only = !p->detail || !*p->detail || (p->title && strcmp(p->detail, p->title) == 0);
    int n = snprintf(out, cap,
                     "{\"type\":\"urn:idemgate:problem:%s\",\"title\":\"%s\",\"status\":%d,"
                     "\"detail\":\"%s\",\"request_id\":\"%s\",\"error\":{\"message\":\"%s%s%s\","
                     "\"type\":\"%s\",\"code\":\"%s\"}}",
                     type, title, p->status, detail, rid, title, title_only ? "" : ": ",
                     title_only ? "" : detail, problem_error_type(p->status), type);
    /* The parts' maxima keep n below PROBLEM_BODY_MAX (test_problem renders the largest). */
    if (n < 0 || (size_t)n >= cap) {
        out[0] = '\0';
        return 0;
    }
    return (size_t)n;
}
