#ifndef IDEMGATE_MOCK_FORM_H
#define IDEMGATE_MOCK_FORM_H

#include <cjson/cJSON.h>
#include <stddef.h>

/*
 * idemgate-mock: the text fields of a multipart/form-data upload (an image edit), read the way
 * a provider reads them, independently of the gateway's own reader.  A field named "_mock"
 * holds the JSON controls a JSON body carries under "_mock"; a field of digits alone is a
 * number (OpenAI's "n"); any other text field is a string; files are counted under
 * "_files".  Returns the object (the caller frees it), or NULL when the body does not follow
 * its boundary.
 */
cJSON *form_fields(const char *content_type, const char *body, size_t len);

#endif
