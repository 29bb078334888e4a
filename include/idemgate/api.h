#ifndef IDEMGATE_API_H
#define IDEMGATE_API_H

#include "idemgate/http.h"

/* The client-facing API (DESIGN.md §4): method + path → handler. Called once the body is
 * complete, and once more after a suspended request is resumed. Always responds or suspends. */
void api_handle(struct http_req *r);

#endif
