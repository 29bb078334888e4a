#include "idemgate/inject.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Skips one JSON string starting at s[i] == '"'; returns the index after its closing quote. */
static size_t skip_string(const char *s, size_t len, size_t i)
{
    for (i++; i < len; i++) {
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    }
    return len;
}

/* Skips one value starting at s[i]; returns the index after it. The input is valid JSON. */
static size_t skip_value(const char *s, size_t len, size_t i)
{
    if (s[i] == '"')
        return skip_string(s, len, i);
    if (s[i] != '{' && s[i] != '[') {
        while (i < len && s[i] != ',' && s[i] != '}' && s[i] != ']')
            i++;
        return i;
    }
    int depth = 0;
    for (; i < len; i++) {
        if (s[i] == '"') {
            i = skip_string(s, len, i) - 1;
        } else if (s[i] == '{' || s[i] == '[') {
            depth++;
        } else if (s[i] == '}' || s[i] == ']') {
            if (--depth == 0)
                return i + 1;
        }
    }
    return len;
}

/* Finds member `name` (name_len bytes, no escapes) in the compact object starting at s[open];
 * returns the index of its value, or 0 when absent. */
static size_t find_member(const char *s, size_t len, size_t open, const char *name, size_t nlen)
{
    size_t i = open + 1;
    while (i < len && s[i] == '"') {
        size_t key_end = skip_string(s, len, i);
        size_t v = key_end + 1; /* after ':' */
        if (key_end - i - 2 == nlen && memcmp(s + i + 1, name, nlen) == 0)
            return v;
        i = skip_value(s, len, v);
        if (i < len && s[i] == ',')
            i++;
    }
    return 0;
}

/* Builds prefix + insert + suffix around position at. */
static int splice(const char *s, size_t len, size_t at, const char *ins, char **out,
                  size_t *out_len)
{
    size_t il = strlen(ins);
    char *b = malloc(len + il + 1);
    if (!b)
        return -1;
    memcpy(b, s, at);
    memcpy(b + at, ins, il);
    memcpy(b + at + il, s + at, len - at);
    b[len + il] = '\0';
    *out = b;
    *out_len = len + il;
    return 0;
}

int inject_member(const char *json, size_t len, const char *field, const char *value, char **out,
                  size_t *out_len)
{
    char ins[512];
    const char *dot = strchr(field, '.');
    if (len < 2 || json[0] != '{' || json[len - 1] != '}' || (dot && strchr(dot + 1, '.')))
        return -1;
    int empty = json[1] == '}';
    if (!dot) {
        if (find_member(json, len, 0, field, strlen(field)))
            return -1;
        snprintf(ins, sizeof(ins), "\"%s\":\"%s\"%s", field, value, empty ? "" : ",");
        return splice(json, len, 1, ins, out, out_len);
    }
    size_t plen = (size_t)(dot - field);
    size_t pv = find_member(json, len, 0, field, plen);
    if (!pv) {
        snprintf(ins, sizeof(ins), "\"%.*s\":{\"%s\":\"%s\"}%s", (int)plen, field, dot + 1, value,
                 empty ? "" : ",");
        return splice(json, len, 1, ins, out, out_len);
    }
    if (json[pv] != '{' || find_member(json, len, pv, dot + 1, strlen(dot + 1)))
        return -1;
    snprintf(ins, sizeof(ins), "\"%s\":\"%s\"%s", dot + 1, value, json[pv + 1] == '}' ? "" : ",");
    return splice(json, len, pv + 1, ins, out, out_len);
}

int inject_compact(const char *json, size_t len, char **out, size_t *out_len)
{
    char *b = malloc(len + 1);
    size_t n = 0;
    int in_string = 0;
    if (!b)
        return -1;
    for (size_t i = 0; i < len; i++) {
        char c = json[i];
        if (in_string) {
            b[n++] = c;
            if (c == '\\' && i + 1 < len)
                b[n++] = json[++i];
            else if (c == '"')
                in_string = 0;
        } else if (c == '"') {
            in_string = 1;
            b[n++] = c;
        } else if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            b[n++] = c;
        }
    }
    b[n] = '\0';
    *out = b;
    *out_len = n;
    return 0;
}
