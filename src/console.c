#include "idemgate/console.h"

#include "idemgate/reply.h"

#include <string.h>

/* Nothing but this origin: no inline script or style, no frame, no form target, no base
 * change. Every request the page makes goes to the gateway that served it. Output previews are
 * fetched with the admin token (a header an <img> cannot send) and shown from blob: URLs the
 * page makes of those bytes, for images and media only. */
#define CONSOLE_CSP                                                                                \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; "              \
    "media-src blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; "                   \
    "frame-ancestors 'none'"

const struct console_asset *console_find(const char *name, size_t len)
{
    for (size_t i = 0; i < console_assets_count; i++)
        if (strlen(console_assets[i].name) == len && memcmp(console_assets[i].name, name, len) == 0)
            return &console_assets[i];
    return NULL;
}

static void serve(struct hs_req *r, const struct console_asset *f)
{
    static const char *const headers[] = {"Content-Security-Policy",
                                          CONSOLE_CSP,
                                          "X-Content-Type-Options",
                                          "nosniff",
                                          "Referrer-Policy",
                                          "no-referrer",
                                          "X-Frame-Options",
                                          "DENY",
                                          NULL};
    if (!f) {
        reply_problem(r, 404, "not-found", "Not found", "no such endpoint", 0);
        return;
    }
    hs_respond(r, 200, f->content_type, (const char *)f->data, f->len, headers);
}

void console_page(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    serve(r, console_find("index.html", 10));
}

void console_asset(struct hs_req *r, const struct api_args *a)
{
    /* index.html is the page's only name: /console/index.html would be a second URL for it. */
    const char *name = a->n ? a->arg[0] : "";
    size_t len = a->n ? a->len[0] : 0;
    serve(r, len && !(len == 10 && memcmp(name, "index.html", 10) == 0) ? console_find(name, len)
                                                                        : NULL);
}
