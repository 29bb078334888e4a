#include "idemgate/pricing.h"

#include "idemgate/jpath.h"
#include "idemgate/multipart.h"
#include "idemgate/upload.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void errf(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

/* The members of a price table (members.h), as the loaders below read them. A variant's table
 * takes the same members as the top level but currency, source and variants; "variants" and
 * "fallback_per_output" are let through there so that their readers refuse them with the reason
 * (a variant has no variants of its own; the fallback belongs to the top level). */
static const struct memb by_m[] = {
    {"defaults", MEMB_VALUE, NULL}, /* one string per key */
    {"keys", MEMB_VALUE, NULL},     /* JSONPaths into the request */
    {"prices", MEMB_VALUE, NULL},   /* keyed by request values */
};
static const struct memb_table by_t = MEMB_TABLE(by_m, NULL);
static const struct memb table_m[] = {
    {"choices_requested", MEMB_VALUE, NULL},
    {"default_seconds", MEMB_VALUE, NULL},
    {"estimate_input_tokens", MEMB_VALUE, NULL},
    {"estimate_output_tokens", MEMB_VALUE, NULL},
    {"height", MEMB_VALUE, NULL},
    {"input_tokens", MEMB_VALUE, NULL},
    {"megapixel", MEMB_VALUE, NULL},
    {"output_tokens", MEMB_VALUE, NULL},
    {"output_tokens_requested", MEMB_VALUE, NULL},
    {"per_megapixel", MEMB_VALUE, NULL},
    {"per_million_input_tokens", MEMB_VALUE, NULL},
    {"per_million_output_tokens", MEMB_VALUE, NULL},
    {"per_output", MEMB_VALUE, NULL},
    {"per_output_by", MEMB_OBJECT, &by_t},
    {"per_request", MEMB_VALUE, NULL},
    {"per_second", MEMB_VALUE, NULL},
    {"per_second_by", MEMB_OBJECT, &by_t},
    {"seconds", MEMB_VALUE, NULL},
    {"usage_settles", MEMB_VALUE, NULL},
    {"width", MEMB_VALUE, NULL},
};
static const struct memb_table table_t = MEMB_TABLE(table_m, NULL);
static const struct memb variant_table_m[] = {
    {"fallback_per_output", MEMB_VALUE, NULL},
    {"variants", MEMB_VALUE, NULL},
};
static const struct memb_table variant_table_t = MEMB_TABLE(variant_table_m, &table_t);
static const struct memb variants_m[] = {
    {"default_when", MEMB_VALUE, NULL},
    {"defaults", MEMB_VALUE, NULL},
    {"keys", MEMB_VALUE, NULL},
    {"tables", MEMB_MAP, &variant_table_t}, /* keyed by request values */
};
static const struct memb_table variants_t = MEMB_TABLE(variants_m, NULL);
static const struct memb top_m[] = {
    {"currency", MEMB_VALUE, NULL},
    {"fallback_per_output", MEMB_VALUE, NULL},
    {"source", MEMB_VALUE, NULL},
    {"variants", MEMB_OBJECT, &variants_t},
};
const struct memb_table price_table_members = MEMB_TABLE(top_m, &table_t);

/* a + b and a * b, saturating at PRICE_MAX (both operands are never negative here). */
static long long sat_add(long long a, long long b)
{
    return a > PRICE_MAX - b ? PRICE_MAX : a + b;
}

static long long sat_mul(long long a, double b)
{
    double v = (double)a * b;
    return v >= (double)PRICE_MAX ? PRICE_MAX : v <= 0 ? 0 : (long long)llround(v);
}

/* A non-negative integer member in micro-units (absent: def). -1 when it is not one. */
static int get_micros(const cJSON *o, const char *key, long long def, long long *out,
                      char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = def;
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > (double)PRICE_MAX ||
        v->valuedouble != floor(v->valuedouble)) {
        errf(err, errlen, "pricing.%s must be a whole number of micro-units (0 or more)", key);
        return -1;
    }
    *out = (long long)v->valuedouble;
    return 0;
}

static int get_path(const cJSON *o, const char *key, struct jpath **out, char *err,
                    size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    const char *why = NULL;
    *out = NULL;
    if (!v)
        return 0;
    if (!cJSON_IsString(v) || jpath_compile(v->valuestring, out, &why) < 0) {
        errf(err, errlen, "pricing.%s: %s", key, why ? why : "must be a JSONPath string");
        return -1;
    }
    return 0;
}

/* One path or a list of them (1 to cap). */
static int get_paths(const cJSON *o, const char *key, struct jpath **out, size_t cap, char *err,
                     size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsString(v))
        return get_path(o, key, &out[0], err, errlen);
    int n = cJSON_GetArraySize(v);
    if (!cJSON_IsArray(v) || n < 1 || (size_t)n > cap) {
        errf(err, errlen, "pricing.%s must be a JSONPath string or a list of 1 to %zu", key, cap);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, i);
        const char *why = NULL;
        if (!cJSON_IsString(e) || jpath_compile(e->valuestring, &out[i], &why) < 0) {
            errf(err, errlen, "pricing.%s[%d]: %s", key, i, why ? why : "must be a JSONPath string");
            return -1;
        }
    }
    return 0;
}

/* keys/defaults of a "…_by" or "variants" member. */
static int load_keys(const cJSON *o, const char *name, struct price_keys *k, char *err,
                     size_t errlen)
{
    const cJSON *keys = cJSON_GetObjectItemCaseSensitive(o, "keys");
    const cJSON *defs = cJSON_GetObjectItemCaseSensitive(o, "defaults");
    int n = cJSON_GetArraySize(keys);
    if (!cJSON_IsArray(keys) || n < 1 || n > PRICE_MAX_BY ||
        (defs && (!cJSON_IsArray(defs) || cJSON_GetArraySize(defs) != n))) {
        errf(err, errlen, "pricing.%s needs \"keys\" (1 to %d paths) and optionally "
                          "\"defaults\" (one string per key)", name, PRICE_MAX_BY);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const cJSON *p = cJSON_GetArrayItem(keys, i);
        const cJSON *d = defs ? cJSON_GetArrayItem(defs, i) : NULL;
        const char *why = NULL;
        if (!cJSON_IsString(p) || jpath_compile(p->valuestring, &k->paths[i], &why) < 0) {
            errf(err, errlen, "pricing.%s.keys[%d]: %s", name, i,
                 why ? why : "must be a JSONPath string");
            return -1;
        }
        k->n = i + 1;
        if (d && !cJSON_IsString(d)) {
            errf(err, errlen, "pricing.%s.defaults[%d] must be a string", name, i);
            return -1;
        }
        k->defaults[i] = strdup(d ? d->valuestring : "");
        if (!k->defaults[i])
            return -1;
    }
    return 0;
}

static void keys_fini(struct price_keys *k)
{
    for (int i = 0; i < PRICE_MAX_BY; i++) {
        jpath_free(k->paths[i]);
        free(k->defaults[i]);
    }
}

static int load_by(const cJSON *by, const char *name, struct price_by *t, char *err,
                   size_t errlen)
{
    const cJSON *prices = cJSON_GetObjectItemCaseSensitive(by, "prices");
    if (load_keys(by, name, &t->k, err, errlen) < 0)
        return -1;
    if (!cJSON_IsObject(prices)) {
        errf(err, errlen, "pricing.%s needs \"prices\" (an object)", name);
        return -1;
    }
    size_t np = (size_t)cJSON_GetArraySize(prices);
    t->prices = calloc(np ? np : 1, sizeof(*t->prices));
    if (!t->prices)
        return -1;
    for (const cJSON *e = prices->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > (double)PRICE_MAX ||
            e->valuedouble != floor(e->valuedouble)) {
            errf(err, errlen, "pricing.%s.prices.%s must be a whole number of micro-units", name,
                 e->string);
            return -1;
        }
        struct price_entry *pe = &t->prices[t->n_prices];
        pe->key = strdup(e->string);
        if (!pe->key)
            return -1;
        pe->micros = (long long)e->valuedouble;
        t->n_prices++;
    }
    return 0;
}

static void by_fini(struct price_by *t)
{
    keys_fini(&t->k);
    for (size_t i = 0; i < t->n_prices; i++)
        free(t->prices[i].key);
    free(t->prices);
}

static int load_table(const cJSON *j, struct price_table *t, int nested, char *err,
                      size_t errlen);

/* "variants": {"keys", "defaults", "tables": {value: table}}; each table inherits the currency. */
/* variants.default_when: [{"variant": name, "if": ["$.path", "$.path=value", …]}, …]. */
static int load_when(const cJSON *v, struct price_table *t, char *err, size_t errlen)
{
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(v, "default_when");
    if (!w)
        return 0;
    int n = cJSON_GetArraySize(w);
    if (!cJSON_IsArray(w) || n < 1 || n > PRICE_MAX_WHEN || t->variant_keys.n != 1) {
        errf(err, errlen, "pricing.variants.default_when must be a list of 1 to %d rules, with "
                          "one variant key", PRICE_MAX_WHEN);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const cJSON *r = cJSON_GetArrayItem(w, i);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(r, "variant");
        const cJSON *conds = cJSON_GetObjectItemCaseSensitive(r, "if");
        int m = cJSON_GetArraySize(conds);
        int named = 0;
        for (size_t k = 0; cJSON_IsString(name) && k < t->n_variants; k++)
            named |= strcmp(t->variants[k].key, name->valuestring) == 0;
        if (!cJSON_IsObject(r) || !named || !cJSON_IsArray(conds) || m < 1 ||
            m > PRICE_MAX_WHEN_IF) {
            errf(err, errlen, "pricing.variants.default_when[%d] needs \"variant\" (a table "
                              "of tables) and \"if\" (1 to %d conditions)", i, PRICE_MAX_WHEN_IF);
            return -1;
        }
        struct price_when *pw = &t->when[t->n_when++]; /* freed with t from here */
        if (!(pw->variant = strdup(name->valuestring)))
            return -1;
        for (int k = 0; k < m; k++) {
            const cJSON *c = cJSON_GetArrayItem(conds, k);
            const char *eq = cJSON_IsString(c) ? strchr(c->valuestring, '=') : NULL;
            char path[256];
            const char *why = NULL;
            size_t plen = eq ? (size_t)(eq - c->valuestring)
                         : cJSON_IsString(c) ? strlen(c->valuestring) : sizeof(path);
            if (plen >= sizeof(path)) {
                errf(err, errlen, "pricing.variants.default_when[%d].if[%d] must be \"$.path\" "
                                  "or \"$.path=value\"", i, k);
                return -1;
            }
            memcpy(path, c->valuestring, plen);
            path[plen] = '\0';
            if (jpath_compile(path, &pw->paths[pw->n], &why) < 0) {
                errf(err, errlen, "pricing.variants.default_when[%d].if[%d]: %s", i, k,
                     why ? why : "not a path");
                return -1;
            }
            if (eq && !(pw->values[pw->n] = strdup(eq + 1))) {
                jpath_free(pw->paths[pw->n]);
                return -1;
            }
            pw->n++;
        }
    }
    return 0;
}

static int load_variants(const cJSON *v, struct price_table *t, char *err, size_t errlen)
{
    const cJSON *tables = cJSON_GetObjectItemCaseSensitive(v, "tables");
    if (load_keys(v, "variants", &t->variant_keys, err, errlen) < 0)
        return -1;
    if (!cJSON_IsObject(tables) || !tables->child) {
        errf(err, errlen, "pricing.variants needs \"tables\" (an object: a price table per "
                          "request value)");
        return -1;
    }
    size_t n = (size_t)cJSON_GetArraySize(tables);
    t->variants = calloc(n, sizeof(*t->variants));
    if (!t->variants)
        return -1;
    for (const cJSON *e = tables->child; e; e = e->next) {
        struct price_variant *pv = &t->variants[t->n_variants++]; /* freed with t from here */
        char why[200] = "";
        if (!cJSON_IsObject(e) || load_table(e, &pv->table, 1, why, sizeof(why)) < 0) {
            const char *rest = strncmp(why, "pricing.", 8) == 0 ? why + 8 : why;
            errf(err, errlen, "pricing.variants.tables.%s%s%s", e->string,
                 cJSON_IsObject(e) ? "." : " must be an object", cJSON_IsObject(e) ? rest : "");
            return -1;
        }
        pv->table.present = 1;
        pv->table.currency = strdup(t->currency);
        pv->key = strdup(e->string);
        if (!pv->key || !pv->table.currency)
            return -1;
    }
    return load_when(v, t, err, errlen);
}

/* Every member but currency and source; nested: a variant's table (no variants of its own). */
static int load_table(const cJSON *j, struct price_table *t, int nested, char *err,
                      size_t errlen)
{
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(j, "default_seconds");
    if (ds && (!cJSON_IsNumber(ds) || ds->valuedouble < 0 || ds->valuedouble > 86400)) {
        errf(err, errlen, "pricing.default_seconds must be a number of seconds (0 to 86400)");
        return -1;
    }
    t->default_seconds = ds ? ds->valuedouble : 0;
    const cJSON *us = cJSON_GetObjectItemCaseSensitive(j, "usage_settles");
    if (us && !cJSON_IsBool(us)) {
        errf(err, errlen, "pricing.usage_settles must be true or false");
        return -1;
    }
    t->usage_settles = cJSON_IsTrue(us);
    const cJSON *by = cJSON_GetObjectItemCaseSensitive(j, "per_output_by");
    const cJSON *sby = cJSON_GetObjectItemCaseSensitive(j, "per_second_by");
    const cJSON *var = cJSON_GetObjectItemCaseSensitive(j, "variants");
    if (var && nested) {
        errf(err, errlen, "pricing.variants: a variant's table has no variants of its own");
        return -1;
    }
    if (nested && cJSON_GetObjectItemCaseSensitive(j, "fallback_per_output")) {
        errf(err, errlen, "pricing.fallback_per_output belongs to the top-level table");
        return -1;
    }
    if (get_micros(j, "per_request", 0, &t->per_request, err, errlen) < 0 ||
        get_micros(j, "per_output", 0, &t->per_output, err, errlen) < 0 ||
        get_micros(j, "per_megapixel", 0, &t->per_megapixel, err, errlen) < 0 ||
        get_micros(j, "per_second", 0, &t->per_second, err, errlen) < 0 ||
        get_micros(j, "per_million_input_tokens", 0, &t->per_mtok_in, err, errlen) < 0 ||
        get_micros(j, "per_million_output_tokens", 0, &t->per_mtok_out, err, errlen) < 0 ||
        get_micros(j, "estimate_input_tokens", 0, &t->estimate_tokens_in, err, errlen) < 0 ||
        get_micros(j, "estimate_output_tokens", 0, &t->estimate_tokens_out, err, errlen) < 0 ||
        get_path(j, "seconds", &t->seconds, err, errlen) < 0 ||
        get_path(j, "width", &t->width, err, errlen) < 0 ||
        get_path(j, "height", &t->height, err, errlen) < 0 ||
        get_path(j, "input_tokens", &t->tokens_in, err, errlen) < 0 ||
        get_path(j, "output_tokens", &t->tokens_out, err, errlen) < 0 ||
        get_paths(j, "output_tokens_requested", t->tokens_out_asked, PRICE_MAX_ASKED, err,
                  errlen) < 0 ||
        get_path(j, "choices_requested", &t->choices, err, errlen) < 0 ||
        (by && load_by(by, "per_output_by", &t->output_by, err, errlen) < 0) ||
        (sby && load_by(sby, "per_second_by", &t->second_by, err, errlen) < 0) ||
        (var && load_variants(var, t, err, errlen) < 0)) {
        if (!err[0])
            errf(err, errlen, "pricing: out of memory");
        return -1;
    }
    const cJSON *mp = cJSON_GetObjectItemCaseSensitive(j, "megapixel");
    if (mp && (!cJSON_IsNumber(mp) || mp->valuedouble < 1 || mp->valuedouble > 1e12 ||
               mp->valuedouble != floor(mp->valuedouble))) {
        errf(err, errlen, "pricing.megapixel must be a whole number of pixels (1 or more)");
        return -1;
    }
    t->megapixel = mp ? (long long)mp->valuedouble : 1000000;
    if (t->per_megapixel && (!t->width || !t->height)) {
        errf(err, errlen, "pricing.per_megapixel needs \"width\" and \"height\" (paths in "
                          "the request)");
        return -1;
    }
    if (t->usage_settles && !t->tokens_in && !t->tokens_out) {
        errf(err, errlen, "pricing.usage_settles needs \"input_tokens\" or \"output_tokens\" "
                          "(paths in the usage)");
        return -1;
    }
    if ((t->per_second || t->second_by.k.n) && !t->seconds && t->default_seconds <= 0) {
        errf(err, errlen, "pricing.per_second%s needs \"seconds\" (a path in the request) or "
                          "\"default_seconds\"", t->per_second ? "" : "_by");
        return -1;
    }
    return 0;
}

/* fallback_per_output: top level only, and only beside variants (without them every request is
 * priced by the top-level members). */
static int load_fallback(const cJSON *j, struct price_table *t, char *err, size_t errlen)
{
    const cJSON *fb = cJSON_GetObjectItemCaseSensitive(j, "fallback_per_output");
    if (!fb)
        return 0;
    if (!t->n_variants) {
        errf(err, errlen, "pricing.fallback_per_output prices a request no variant names: it "
                          "needs \"variants\" (set per_output otherwise)");
        return -1;
    }
    if (get_micros(j, "fallback_per_output", 0, &t->fallback_per_output, err, errlen) < 0)
        return -1;
    t->has_fallback = 1;
    return 0;
}

int price_table_load(const cJSON *j, struct price_table *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof(*t));
    if (!j)
        return 0;
    const char *cur = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "currency"));
    if (!cJSON_IsObject(j) || !cur || strlen(cur) != 3 || strspn(cur, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != 3) {
        errf(err, errlen, "pricing.currency must be an ISO 4217 code such as \"USD\"");
        return -1;
    }
    const char *src = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "source"));
    t->currency = strdup(cur);
    t->source = src ? strdup(src) : NULL;
    if (!t->currency || (src && !t->source) || load_table(j, t, 0, err, errlen) < 0 ||
        load_fallback(j, t, err, errlen) < 0) {
        if (!err[0])
            errf(err, errlen, "pricing: out of memory");
        price_table_fini(t);
        return -1;
    }
    t->present = 1;
    return 0;
}

void price_table_fini(struct price_table *t)
{
    free(t->currency);
    free(t->source);
    by_fini(&t->output_by);
    by_fini(&t->second_by);
    jpath_free(t->width);
    jpath_free(t->height);
    jpath_free(t->seconds);
    jpath_free(t->tokens_in);
    jpath_free(t->tokens_out);
    for (size_t i = 0; i < PRICE_MAX_ASKED; i++)
        jpath_free(t->tokens_out_asked[i]);
    jpath_free(t->choices);
    keys_fini(&t->variant_keys);
    for (size_t i = 0; i < t->n_when; i++) {
        free(t->when[i].variant);
        for (size_t k = 0; k < t->when[i].n; k++) {
            jpath_free(t->when[i].paths[k]);
            free(t->when[i].values[k]);
        }
    }
    for (size_t i = 0; i < t->n_variants; i++) {
        free(t->variants[i].key);
        price_table_fini(&t->variants[i].table);
    }
    free(t->variants);
    memset(t, 0, sizeof(*t));
}

/* A request value as the text a price key holds: strings as they are, whole numbers without a
 * fraction, booleans as true/false; NULL for anything else. */
static const char *value_text(const cJSON *v, char *buf, size_t len)
{
    if (cJSON_IsString(v))
        return v->valuestring;
    if (cJSON_IsBool(v))
        return cJSON_IsTrue(v) ? "true" : "false";
    if (cJSON_IsNumber(v)) {
        snprintf(buf, len, "%.15g", v->valuedouble);
        return buf;
    }
    return NULL;
}

/* The request's values for k joined with '|' into key; -1 when they do not fit. */
static int request_key(const struct price_keys *k, const cJSON *body, char *key, size_t len)
{
    char num[32];
    size_t pos = 0;
    for (int i = 0; i < k->n; i++) {
        const char *v = value_text(jpath_first(k->paths[i], body), num, sizeof(num));
        int n = snprintf(key + pos, len - pos, "%s%s", i ? "|" : "", v ? v : k->defaults[i]);
        if (n < 0 || (size_t)n >= len - pos)
            return -1;
        pos += (size_t)n;
    }
    return 0;
}

/* The entry the request's values name, or NULL. */
static const struct price_entry *by_entry(const struct price_by *t, const cJSON *body)
{
    char key[256];
    if (!t->k.n || request_key(&t->k, body, key, sizeof(key)) < 0)
        return NULL;
    for (size_t i = 0; i < t->n_prices; i++)
        if (strcmp(t->prices[i].key, key) == 0)
            return &t->prices[i];
    return NULL;
}

/* The price by request values (fallback: the request's values name no entry). */
static long long by_price(const struct price_by *t, const cJSON *body, long long fallback)
{
    const struct price_entry *e = by_entry(t, body);
    return e ? e->micros : fallback;
}

/* The variant default_when names for a request that names none, or NULL. */
static const char *when_default(const struct price_table *t, const cJSON *body)
{
    char num[32];
    if (!t->n_when || value_text(jpath_first(t->variant_keys.paths[0], body), num, sizeof(num)))
        return NULL;
    for (size_t i = 0; i < t->n_when; i++)
        for (size_t k = 0; k < t->when[i].n; k++) {
            const cJSON *v = jpath_first(t->when[i].paths[k], body);
            const char *text = value_text(v, num, sizeof(num));
            if (t->when[i].values[k] ? text && strcmp(text, t->when[i].values[k]) == 0
                                     : v && !cJSON_IsNull(v))
                return t->when[i].variant;
        }
    return NULL;
}

/* The table that prices this request: the variant its values name (or default_when's), else t
 * itself. */
static const struct price_table *pick(const struct price_table *t, const cJSON *body)
{
    char key[256];
    if (!t->n_variants)
        return t;
    const char *when = when_default(t, body);
    if (when)
        snprintf(key, sizeof(key), "%s", when);
    else if (request_key(&t->variant_keys, body, key, sizeof(key)) < 0)
        return t;
    for (size_t i = 0; i < t->n_variants; i++)
        if (strcmp(t->variants[i].key, key) == 0)
            return &t->variants[i].table;
    return t;
}

/* A non-negative number at a path: a JSON number, or a string that is entirely one. -1: none. */
static double number_at(const struct jpath *p, const cJSON *root)
{
    const cJSON *v = p ? jpath_first(p, root) : NULL;
    if (cJSON_IsNumber(v))
        return v->valuedouble >= 0 ? v->valuedouble : -1;
    if (cJSON_IsString(v) && v->valuestring[0]) {
        char *end;
        double d = strtod(v->valuestring, &end);
        return *end == '\0' && d >= 0 && isfinite(d) ? d : -1;
    }
    return -1;
}

/* The price of `outputs` outputs of this request, seconds included. */
static long long outputs_price(const struct price_table *t, const cJSON *body, int outputs)
{
    if (outputs < 0)
        outputs = 0;
    long long each = by_price(&t->output_by, body, t->per_output);
    double w = t->per_megapixel ? number_at(t->width, body) : -1;
    double h = t->per_megapixel ? number_at(t->height, body) : -1;
    if (w >= 0 && h >= 0) {
        double mp = ceil(w * h / (double)t->megapixel);
        each = sat_mul(t->per_megapixel, mp);
    }
    long long per_second = by_price(&t->second_by, body, t->per_second);
    if (per_second) {
        double s = number_at(t->seconds, body);
        if (s < 0)
            s = t->default_seconds;
        each = sat_add(each, sat_mul(per_second, s));
    }
    return sat_mul(each, outputs);
}

/* The output tokens a request may make, for an estimate: its own bound (the first of the
 * table's paths that holds a number), else the table's estimate; times the completions it asks
 * for (1 to 128: an API's own limit; anything else counts as 1). */
static double asked_out(const struct price_table *t, const cJSON *body)
{
    double out = -1;
    for (size_t i = 0; i < PRICE_MAX_ASKED && out < 0 && t->tokens_out_asked[i]; i++)
        out = number_at(t->tokens_out_asked[i], body);
    if (out < 0)
        out = (double)t->estimate_tokens_out;
    double n = t->choices ? number_at(t->choices, body) : -1;
    return n >= 1 && n <= 128 ? out * floor(n) : out;
}

static long long tokens_price(const struct price_table *t, double in, double out)
{
    return sat_add(sat_mul(t->per_mtok_in, in / 1e6), sat_mul(t->per_mtok_out, out / 1e6));
}

/* 1 when a price by request values has entries and the request's values name none of them. */
static int by_misses(const struct price_by *b, const cJSON *body)
{
    return b->k.n && b->n_prices && !by_entry(b, body);
}

/* 1 when the table does not list the request (doc, parsed): no variant names it and the
 * top-level members price nothing (a model the table does not list); or, in the table that
 * prices it, a price by request values names none of the request's values and no flat price
 * stands beside it (a model and size pair a per_second_by does not list: its seconds were
 * priced at 0). Whether a fallback prices it is the caller's to ask. */
static int unlisted(const struct price_table *t, const cJSON *doc)
{
    if (!t || !t->present)
        return 0;
    const struct price_table *u = t;
    if (t->n_variants) {
        u = pick(t, doc);
        if (u == t && !(t->per_request || t->per_output || t->per_megapixel || t->per_second ||
                        t->per_mtok_in || t->per_mtok_out || t->output_by.n_prices ||
                        t->second_by.n_prices))
            return 1;
    }
    if (by_misses(&u->second_by, doc) && !u->per_second)
        return 1;
    return by_misses(&u->output_by, doc) && !u->per_output && !u->per_megapixel;
}

/* An unlisted request priced by the fallback: n outputs. */
static long long fallback_price(const struct price_table *t, int n)
{
    return sat_mul(t->fallback_per_output, n < 0 ? 0 : n);
}

/* A job's price, at most PRICE_JOB_MAX. */
static long long job_price(long long v)
{
    return v > PRICE_JOB_MAX ? PRICE_JOB_MAX : v;
}

long long price_estimate(const struct price_table *top, const cJSON *body, int outputs_requested)
{
    if (!top || !top->present)
        return 0;
    if (top->has_fallback && unlisted(top, body))
        return job_price(fallback_price(top, outputs_requested < 1 ? 1 : outputs_requested));
    const struct price_table *t = pick(top, body);
    long long c = sat_add(t->per_request,
                          outputs_price(t, body, outputs_requested < 1 ? 1 : outputs_requested));
    /* The most output the request allows (an LLM's max_tokens, times its completions). */
    return job_price(
        sat_add(c, tokens_price(t, (double)t->estimate_tokens_in, asked_out(t, body))));
}

long long price_actual(const struct price_table *top, const cJSON *body, int outputs_requested,
                       int outputs_received, const cJSON *usage)
{
    if (!top || !top->present)
        return 0;
    const struct price_table *t = pick(top, body);
    int n = outputs_received >= 0 ? outputs_received
                                  : outputs_requested >= 1 ? outputs_requested : 1;
    if (top->has_fallback && unlisted(top, body))
        return job_price(fallback_price(top, n));
    double in = number_at(t->tokens_in, usage), out = number_at(t->tokens_out, usage);
    int reported = in >= 0 || out >= 0;
    /* Billed by tokens: what the usage reports is the cost, the outputs were the estimate. */
    long long c = t->per_request;
    if (!(t->usage_settles && reported))
        c = sat_add(c, outputs_price(t, body, n));
    /* No usage reported (a stream without include_usage): the estimate's tokens, as the
     * reservation counted them — a settle at 0 would let a tenant's spend pass its budget. */
    if (!reported) {
        in = (double)t->estimate_tokens_in;
        out = asked_out(t, body);
    }
    return job_price(sat_add(c, tokens_price(t, in < 0 ? 0 : in, out < 0 ? 0 : out)));
}

long long price_estimate_raw(const struct price_table *t, const char *body, size_t len,
                             int outputs_requested)
{
    if (!t || !t->present)
        return 0;
    cJSON *doc = body && len ? cJSON_ParseWithLength(body, len) : NULL;
    long long c = price_estimate(t, doc, outputs_requested);
    cJSON_Delete(doc);
    return c;
}

/* The document a stored body's prices read: the JSON body itself, or for a multipart one (as the
 * client sent it, or in its stored form with the large parts cut out: upload.h) the JSON of its
 * text fields, as the intake priced it (mp_fields_json). NULL when it is neither. */
static cJSON *price_doc(const char *body, size_t len)
{
    if (!body || !len)
        return NULL;
    struct upl_ref refs[MP_MAX_PARTS];
    size_t nrefs = 0, at = 0, total = 0;
    if (upl_is_stored_form(body, len) &&
        upl_parse(body, len, refs, MP_MAX_PARTS, &nrefs, &at, &total, (size_t)-1) == 0) {
        body += at; /* the client's body with the cut contents left out: its fields are whole */
        len -= at;
    }
    char ctype[MP_CTYPE_MAX], boundary[MP_BOUNDARY_MAX + 1], why[160];
    if (!mp_content_type_of(body, len, ctype, sizeof(ctype)))
        return cJSON_ParseWithLength(body, len);
    struct mp_part *parts = calloc(MP_MAX_PARTS, sizeof(*parts));
    size_t n = 0, flen = 0;
    char *fields = parts && mp_boundary(ctype, boundary) > 0 &&
                           mp_parse(body, len, boundary, parts, MP_MAX_PARTS, &n, why,
                                    sizeof(why)) == 0
                       ? mp_fields_json(parts, n, &flen)
                       : NULL;
    cJSON *doc = fields ? cJSON_ParseWithLength(fields, flen) : NULL;
    free(fields);
    free(parts);
    return doc;
}

int price_currency_fits(const struct price_table *t, const char *recorded)
{
    if (!recorded || !*recorded)
        return 1;
    return t->currency && strcmp(t->currency, recorded) == 0;
}

long long price_actual_raw(const struct price_table *t, const char *body, size_t len,
                           int outputs_requested, int outputs_received, const char *usage,
                           int *is_unlisted)
{
    if (is_unlisted)
        *is_unlisted = 0;
    if (!t || !t->present)
        return 0;
    cJSON *doc = price_doc(body, len);
    cJSON *u = usage ? cJSON_Parse(usage) : NULL;
    long long c = price_actual(t, doc, outputs_requested, outputs_received, u);
    if (is_unlisted)
        *is_unlisted = unlisted(t, doc) && !t->has_fallback;
    cJSON_Delete(doc);
    cJSON_Delete(u);
    return c;
}

int price_unlisted_raw(const struct price_table *t, const char *body, size_t len)
{
    if (!t || !t->present)
        return 0;
    cJSON *doc = price_doc(body, len);
    int u = unlisted(t, doc) && !t->has_fallback;
    cJSON_Delete(doc);
    return u;
}

int price_parse_amount(const char *s, long long *micros)
{
    long long whole = 0, frac = 0;
    int digits = 0, fdigits = 0;
    const char *p = s;
    if (!s)
        return -1;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if (whole > (PRICE_MAX / 1000000 - 9) / 10)
            return -1;
        whole = whole * 10 + (*p - '0');
    }
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, fdigits++) {
            if (fdigits == 6)
                return -1;
            frac = frac * 10 + (*p - '0');
        }
        if (!fdigits)
            return -1;
    }
    if (*p || !digits)
        return -1;
    for (int i = fdigits; i < 6; i++)
        frac *= 10;
    *micros = whole * 1000000 + frac;
    return 0;
}

char *price_format(long long micros, char *buf, size_t len)
{
    const char *sign = micros < 0 ? "-" : "";
    unsigned long long m = micros < 0 ? (unsigned long long)-(micros + 1) + 1 : (unsigned long long)micros;
    snprintf(buf, len, "%s%llu.%06llu", sign, m / 1000000, m % 1000000);
    return buf;
}
