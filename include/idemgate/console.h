#ifndef IDEMGATE_CONSOLE_H
#define IDEMGATE_CONSOLE_H

#include "idemgate/api.h"
#include "idemgate/http_server.h"

#include <stddef.h>

/* The operator console: static files (console/ in the source tree) embedded in the binary at
 * build time by scripts/embed_console.sh, served under /console with a Content-Security-Policy
 * that allows nothing but this origin. The page itself holds no data: it calls the admin API with
 * the admin token the operator signs in with, like curl would. */

/* One embedded file. */
struct console_asset {
    const char *name; /* "index.html", "app.js", … */
    const char *content_type;
    const unsigned char *data;
    size_t len;
};

/* The embedded files (generated), and how many there are. */
extern const struct console_asset console_assets[];
extern const size_t console_assets_count;

/* The asset called name (len bytes, not NUL-terminated), or NULL. Pure. */
const struct console_asset *console_find(const char *name, size_t len);

/* GET /console (the page) and GET /console/{asset}: the file, or 404. */
void console_page(struct hs_req *r, const struct api_args *a);
void console_asset(struct hs_req *r, const struct api_args *a);

#endif
