#include "idemgate/cli.h"

#include "idemgate/archive.h"
#include "idemgate/cliargs.h"
#include "idemgate/crypto.h"
#include "idemgate/distribute.h"
#include "idemgate/jobview.h"
#include "idemgate/lease.h"
#include "idemgate/migrate.h"
#include "idemgate/pricing.h"
#include "idemgate/provider.h"
#include "idemgate/secrets.h"
#include "idemgate/store.h"
#include "idemgate/usage.h"
#include "idemgate/wake.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct db *open_or_complain(const struct cfg *cfg)
{
    struct db *db = store_db_open(cfg->database_url);
    if (!db || store_db_ensure(db) < 0) {
        fprintf(stderr, "idemgate: cannot connect to the database (DATABASE_URL)\n");
        store_db_close(db);
        return NULL;
    }
    return db;
}

int cli_migrate(const struct cfg *cfg, int argc, char **argv)
{
    int citus = argc >= 1 && strcmp(argv[0], "--citus") == 0;
    if (argc > (citus ? 1 : 0)) {
        fprintf(stderr, "usage: idemgate migrate [--citus]\n");
        return 2;
    }
    struct db *db = open_or_complain(cfg);
    if (!db)
        return 1;
    int e = migrate_run(db);
    if (e == 0 && citus && (e = dist_run(db)) == 0)
        printf("schema distributed by tenant (Citus)\n");
    int v = 0;
    if (e == 0 && store_schema_version(db, &v) == 0)
        printf("schema at version %d\n", v);
    store_db_close(db);
    return e == 0 ? 0 : 1;
}

static void print_tenant(const char *name, const char *created, const char *revoked, void *arg)
{
    (void)arg;
    printf("%-32s created %s%s%s\n", name, created, revoked ? "  revoked " : "",
           revoked ? revoked : "");
}

/* `tenant limits NAME [--rps N] [--burst N] [--waits N]`: an option left out (or given as
 * "default") goes back to the configuration's default. 0 on success. */
static int tenant_limits(struct db *db, int argc, char **argv)
{
    int v[3] = {-1, -1, -1};
    static const char *const opt[3] = {"--rps", "--burst", "--waits"};
    for (int i = 2; i < argc; i += 2) {
        int k = -1;
        for (int j = 0; j < 3; j++)
            if (strcmp(argv[i], opt[j]) == 0)
                k = j;
        char *end = NULL;
        long n = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : -1;
        if (k < 0 || i + 1 >= argc) {
            fprintf(stderr, "idemgate: usage: idemgate tenant limits NAME [--rps N] "
                            "[--burst N] [--waits N]\n");
            return 2;
        }
        if (strcmp(argv[i + 1], "default") == 0)
            continue;
        if (!*argv[i + 1] || *end || n < 0 || n > 1000000) {
            fprintf(stderr, "idemgate: %s wants 0..1000000 or \"default\"\n", opt[k]);
            return 2;
        }
        v[k] = (int)n;
    }
    int e = store_tenant_limits_set(db, argv[1], v[0], v[1], v[2]);
    if (e == STORE_ENOTFOUND)
        fprintf(stderr, "idemgate: no live tenant named %s\n", argv[1]);
    else if (e < 0)
        fprintf(stderr, "idemgate: cannot set the limits of %s\n", argv[1]);
    return e == STORE_OK ? 0 : 1;
}

static const char *opt(int argc, char **argv, const char *name);

/* The options of argv[first..) are exactly these (cliargs.h), or the command is refused — with
 * its usage line — before it does anything: 2. */
static int options_ok(int argc, char **argv, int first, const char *const *valued,
                      const char *const *flags, const char *usage)
{
    const char *bad, *why;
    if (cliargs_check(argc, argv, first, valued, flags, &bad, &why) == 0)
        return 1;
    fprintf(stderr, "idemgate: %s: %s\nusage: %s\n", bad, why, usage);
    return 0;
}

/* A limit option: absent → STORE_BUDGET_KEEP (as it is), "none" → -1 (no limit); else an
 * amount (micro-units) or a count. */
static int limit_opt(int argc, char **argv, const char *name, int amount, long long *out)
{
    const char *v = opt(argc, argv, name);
    *out = v ? -1 : STORE_BUDGET_KEEP;
    if (!v || strcmp(v, "none") == 0)
        return 0;
    if (amount)
        return price_parse_amount(v, out);
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || end == v || n < 0 || n > 1000000)
        return -1;
    *out = n;
    return 0;
}

/* idemgate tenant budget NAME [--currency C] [--day AMOUNT] [--month AMOUNT] [--in-flight N]
 * | --clear */
static int tenant_budget(struct db *db, int argc, char **argv)
{
    const char *name = argv[1];
    long long day, month, inflight;
    static const char *const valued[] = {"--currency", "--day", "--month", "--in-flight", NULL};
    static const char *const flags[] = {"--clear", NULL};
    if (!options_ok(argc, argv, 2, valued, argc == 3 ? flags : NULL,
                    "idemgate tenant budget NAME [--currency USD] [--day AMOUNT|none] "
                    "[--month AMOUNT|none] [--in-flight N|none] | --clear"))
        return 2;
    const char *currency = opt(argc, argv, "--currency");
    if (argc == 3 && strcmp(argv[2], "--clear") == 0) {
        int e = store_budget_clear(db, name);
        if (e == STORE_ENOTFOUND)
            fprintf(stderr, "idemgate: tenant %s has no budget\n", name);
        else if (e == 0)
            printf("budget of %s cleared\n", name);
        return e == 0 ? 0 : 1;
    }
    if (limit_opt(argc, argv, "--day", 1, &day) < 0 ||
        limit_opt(argc, argv, "--month", 1, &month) < 0 ||
        limit_opt(argc, argv, "--in-flight", 0, &inflight) < 0 ||
        (currency && (strlen(currency) != 3 ||
                      strspn(currency, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != 3))) {
        fprintf(stderr, "idemgate: --day and --month are amounts (12.50) or none, --in-flight a "
                        "count or none, --currency an ISO 4217 code (USD)\n");
        return 2;
    }
    struct store_budget b = {.day_limit = day, .month_limit = month, .max_inflight = inflight};
    snprintf(b.currency, sizeof(b.currency), "%s", currency ? currency : "");
    int e = store_budget_set(db, name, &b);
    if (e == STORE_ENOTFOUND) {
        fprintf(stderr, "idemgate: no tenant named %s\n", name);
        return 1;
    }
    if (e == STORE_ECONFLICT) {
        fprintf(stderr, "idemgate: --currency changes the budget's unit: give --day and --month "
                        "again (an amount, or none)\n");
        return 2;
    }
    if (e < 0) {
        fprintf(stderr, "idemgate: cannot set the budget of %s\n", name);
        return 1;
    }
    char d[32], m[32], n[32];
    snprintf(n, sizeof(n), "%lld", b.max_inflight);
    printf("budget of %s: %s %s a day, %s a month, %s in flight\n", name, b.currency,
           b.day_limit >= 0 ? price_format(b.day_limit, d, sizeof(d)) : "no limit",
           b.month_limit >= 0 ? price_format(b.month_limit, m, sizeof(m)) : "no limit",
           b.max_inflight >= 0 ? n : "any");
    if (b.recount_err) {
        fprintf(stderr,
                "idemgate: the budget of %s is written, but its jobs in flight could not be "
                "counted again (%s): a job that ended meanwhile may still count; run the same "
                "command again\n",
                name,
                b.recount_err == STORE_ERETRY ? "refused three times: a lock held, or a deadlock"
                                              : "the database failed");
        return 1;
    }
    return 0;
}

int cli_usage(const struct cfg *cfg, int argc, char **argv)
{
    struct usage_query q;
    char err[128];
    if (argc > 0 && strcmp(argv[0], "--help") == 0) {
        printf("usage: idemgate usage [--tenant NAME] [--from DATE] [--to DATE] "
               "[--group-by provider|route|day]\n"
               "  prints GET /v1/usage's document for every tenant (or one): the settled cost of\n"
               "  completed, canceled and abandoned jobs that finished in [from, to) (default:\n"
               "  this UTC month), and the budgets\n");
        return 0;
    }
    static const char *const valued[] = {"--tenant", "--from", "--to", "--group-by", NULL};
    if (!options_ok(argc, argv, 0, valued, NULL,
                    "idemgate usage [--tenant NAME] [--from DATE] [--to DATE] "
                    "[--group-by provider|route|day]"))
        return 2;
    if (usage_query_parse(opt(argc, argv, "--from"), opt(argc, argv, "--to"),
                          opt(argc, argv, "--group-by"), &q, err, sizeof(err)) < 0) {
        fprintf(stderr, "idemgate: %s\n", err);
        return 2;
    }
    struct db *db = open_or_complain(cfg);
    if (!db)
        return 1;
    cJSON *doc = usage_doc_new(&q);
    int e = doc ? store_usage(db, 0, opt(argc, argv, "--tenant"), q.from, q.to,
                              usage_group_name(q.group), usage_add, doc)
                : STORE_EINTERNAL;
    char *text = e == 0 ? cJSON_Print(doc) : NULL;
    if (text)
        printf("%s\n", text);
    else
        fprintf(stderr, "idemgate: cannot read the usage\n");
    free(text);
    cJSON_Delete(doc);
    store_db_close(db);
    return text ? 0 : 1;
}

static void print_line(const char *s, void *arg)
{
    (void)arg;
    printf("%s\n", s);
}

int cli_unreferenced(const struct cfg *cfg, int argc, char **argv)
{
    if (argc < 1 || strcmp(argv[0], "--help") == 0) {
        printf("usage: idemgate unreferenced SHA256...\n"
               "  prints each of the given archived objects (lowercase hex SHA-256) that no\n"
               "  remaining job's outputs reference: the archive may delete them\n");
        return argc < 1 ? 2 : 0;
    }
    struct db *db = open_or_complain(cfg);
    if (!db)
        return 1;
    int e = store_unreferenced_sha256(db, (const char *const *)argv, (size_t)argc, print_line,
                                      NULL);
    if (e < 0)
        fprintf(stderr, "idemgate: give lowercase hex SHA-256 digests\n");
    store_db_close(db);
    return e < 0 ? 1 : 0;
}

int cli_tenant(const struct cfg *cfg, int argc, char **argv)
{
    if (argc < 1 || strcmp(argv[0], "--help") == 0) {
        printf("usage: idemgate tenant add NAME | list | revoke NAME | limits NAME [--rps N] "
               "[--burst N] [--waits N]\n"
               "       idemgate tenant budget NAME [--currency USD] [--day AMOUNT|none] "
               "[--month AMOUNT|none] [--in-flight N|none] | --clear\n"
               "  add     creates a tenant and prints its bearer token once (only its SHA-256 is "
               "stored)\n"
               "  list    lists tenants\n"
               "  revoke  revokes a tenant's token at once\n"
               "  budget  sets (or clears) a tenant's limits: amounts per UTC day and month in\n"
               "          currency units (12.50), and the most jobs in flight at once; what is\n"
               "          left out is kept (the currency: USD on a new budget; a limit: none)\n"
               "  limits  sets a tenant's requests per second, burst and `Prefer: wait` "
               "connections per replica (0: none; left out or \"default\": the configuration's)\n");
        return argc < 1 ? 2 : 0;
    }
    struct db *db = open_or_complain(cfg);
    int rc = 1;
    if (!db)
        return 1;
    if (strcmp(argv[0], "add") == 0 && argc == 2) {
        char token[CRYPTO_TOKEN_LEN], hash[CRYPTO_SHA256_HEX];
        if (crypto_token(token) < 0) {
            fprintf(stderr, "idemgate: no randomness\n");
            goto done;
        }
        crypto_sha256_hex(token, strlen(token), hash);
        int e = store_tenant_add(db, argv[1], hash);
        explicit_bzero(hash, sizeof(hash));
        if (e == STORE_ECONFLICT)
            fprintf(stderr, "idemgate: tenant %s already exists\n", argv[1]);
        else if (e < 0)
            fprintf(stderr, "idemgate: cannot add tenant %s (name: [A-Za-z0-9._-]{1,64})\n",
                    argv[1]);
        else {
            printf("%s\n", token);
            rc = 0;
        }
        explicit_bzero(token, sizeof(token));
    } else if (strcmp(argv[0], "list") == 0 && argc == 1) {
        rc = store_tenant_list(db, print_tenant, NULL) == 0 ? 0 : 1;
    } else if (strcmp(argv[0], "budget") == 0 && argc >= 2) {
        rc = tenant_budget(db, argc, argv);
    } else if (strcmp(argv[0], "limits") == 0 && argc >= 2) {
        rc = tenant_limits(db, argc, argv);
    } else if (strcmp(argv[0], "revoke") == 0 && argc == 2) {
        int e = store_tenant_revoke(db, argv[1]);
        if (e == STORE_ENOTFOUND)
            fprintf(stderr, "idemgate: no live tenant named %s\n", argv[1]);
        rc = e == 0 ? 0 : 1;
    } else {
        fprintf(stderr, "idemgate: usage: idemgate tenant add NAME | list | revoke NAME | "
                        "limits NAME [--rps N] [--burst N] [--waits N]\n");
        rc = 2;
    }
done:
    store_db_close(db);
    return rc;
}

int cli_check_config(const struct cfg *cfg)
{
    int missing = 0;
    for (size_t i = 0; i < cfg->n_providers; i++) {
        const struct cfg_provider *p = &cfg->providers[i];
        char *secret = p->credential ? secret_get(p->credential) : NULL;
        if (p->credential && !secret) {
            if (secret_is_file(p->credential))
                fprintf(stderr,
                        "warning: providers.%s.auth.secret_file: %s cannot be read (missing, "
                        "unreadable, empty or over 64 KiB): nothing is sent until it can\n",
                        p->name, secret_name(p->credential));
            else
                fprintf(stderr, "warning: providers.%s.auth.secret_env: %s is not set\n", p->name,
                        p->credential);
            missing++;
        } else if (secret && !prov_secret_ok(secret)) {
            fprintf(stderr,
                    "warning: providers.%s.auth: %s holds a control character (a line end inside "
                    "it, or at the end of a variable?): nothing is sent with it until it is "
                    "fixed\n",
                    p->name, secret_name(p->credential));
            missing++;
        }
        secret_free(secret);
        /* An async provider's outputs are URLs (result.kind url): none is copied when no host is
         * declared (fetchpol.c), and the provider's URLs expire with the paid results. The
         * shipped profiles declare none (their CDNs are the entry's to name). A synchronous
         * provider may answer base64 (copied without a fetch): not said of it. */
        int urls = p->result_kind && strcmp(p->result_kind, "url") == 0;
        if (urls && (!p->archive || !p->archive->n_hosts))
            fprintf(stderr,
                    "warning: providers.%s.archive.hosts: none declared: outputs this provider "
                    "answers as URLs are never copied (each copy is refused, counted "
                    "outcome=\"failed\") and its URLs expire: add the hosts its outputs come "
                    "from\n",
                    p->name);
    }
    printf("%s: ok (%zu providers%s)\n", cfg->config_path ? cfg->config_path : "(defaults)",
           cfg->n_providers, missing ? ", secrets missing: see warnings" : "");
    return 0;
}

static void print_job_line(const struct store_job *j, void *arg)
{
    (void)arg;
    printf("%-30s %-10s %-16s %-24s %s\n", j->id, st_name(j->state), j->provider,
           j->created_at ? j->created_at : "", j->last_error ? j->last_error : "");
}

static const char *opt(int argc, char **argv, const char *name)
{
    for (int i = 0; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return argv[i + 1];
    return NULL;
}

/* Whether the flag name is among the options of argv[first..) (checked by options_ok first),
 * never a valued option's value (`--operator --force` names an operator). */
static int has_flag(int argc, char **argv, int first, const char *const *valued,
                    const char *name)
{
    for (int i = first; i < argc; i++) {
        int takes = 0;
        for (const char *const *v = valued; v && *v; v++)
            takes |= strcmp(argv[i], *v) == 0;
        if (takes)
            i++;
        else if (strcmp(argv[i], name) == 0)
            return 1;
    }
    return 0;
}

static int jobs_usage(int rc)
{
    printf("usage: idemgate jobs list [--state STATE] [--limit N]\n"
           "       idemgate jobs show ID\n"
           "       idemgate jobs resolve ID found --remote-id RID | absent [--force] | abandon "
           "[--operator NAME]\n"
           "  list     jobs of every tenant, oldest first; STATE is one of\n"
           "          ");
    /* The states of states.c, so that a state added there is listed here. */
    for (int s = 0; s < ST__COUNT; s++)
        printf("%s %s", s ? "," : "", st_name((enum op_state)s));
    printf("\n"
           "  show     one job as JSON\n"
           "  resolve  an operator's decision on a job in review (as POST /v1/jobs/ID/resolve);\n"
           "           absent on a job whose task was seen (a remote id) needs --force\n");
    return rc;
}

int cli_jobs(const struct cfg *cfg, int argc, char **argv)
{
    if (argc < 1 || strcmp(argv[0], "--help") == 0)
        return jobs_usage(argc < 1 ? 2 : 0);
    if (argc > 1 && strcmp(argv[1], "--help") == 0)
        return jobs_usage(0);
    static const char *const list_opts[] = {"--state", "--limit", NULL};
    static const char *const resolve_opts[] = {"--remote-id", "--operator", NULL};
    static const char *const resolve_flags[] = {"--force", NULL};
    if ((strcmp(argv[0], "list") == 0 &&
         !options_ok(argc, argv, 1, list_opts, NULL, "idemgate jobs list [--state STATE] "
                                                     "[--limit N]")) ||
        (strcmp(argv[0], "show") == 0 &&
         !options_ok(argc, argv, 2, NULL, NULL, "idemgate jobs show ID")) ||
        (strcmp(argv[0], "resolve") == 0 &&
         !options_ok(argc, argv, 3, resolve_opts, resolve_flags,
                     "idemgate jobs resolve ID found --remote-id RID | absent [--force] | "
                     "abandon [--operator NAME]")))
        return 2;
    const char *lim0 = strcmp(argv[0], "list") == 0 ? opt(argc, argv, "--limit") : NULL;
    char *lim_end = NULL;
    long lim_n = lim0 ? strtol(lim0, &lim_end, 10) : 100;
    if (lim0 && (!*lim0 || *lim_end || lim_n < 1 || lim_n > 100000)) {
        fprintf(stderr, "idemgate: --limit wants 1..100000\n");
        return 2;
    }
    const char *state = opt(argc, argv, "--state");
    if (state && st_parse(state) < 0) {
        fprintf(stderr, "idemgate: unknown state %s\n", state);
        return 2;
    }
    struct db *db = open_or_complain(cfg);
    int rc = 1;
    if (!db)
        return 1;
    if (strcmp(argv[0], "list") == 0) {
        rc = store_admin_jobs_list(db, state, NULL, (int)lim_n, print_job_line, NULL) == 0
                 ? 0
                 : 1;
    } else if (strcmp(argv[0], "show") == 0 && argc == 2) {
        struct store_job j;
        int e = store_admin_job_get(db, argv[1], &j);
        if (e == STORE_OK) {
            char *json = jobview_json(&j);
            printf("%s\n", json ? json : "{}");
            free(json);
            store_job_fini(&j);
            rc = 0;
        } else {
            fprintf(stderr, "idemgate: no job %s\n", argv[1]);
        }
    } else if (strcmp(argv[0], "resolve") == 0 && argc >= 3) {
        const char *outcome = argv[2];
        const char *remote = opt(argc, argv, "--remote-id");
        const char *op = opt(argc, argv, "--operator");
        int what = st_resolution_parse(outcome);
        long long tenant_id = 0;
        char tenant[72];
        struct store_job j;
        int applied = 0;
        if (what < 0 || (what == RES_FOUND && !remote)) {
            store_db_close(db);
            return jobs_usage(2);
        }
        if (store_admin_tenant_of(db, argv[1], &tenant_id, tenant, sizeof(tenant), NULL) !=
                STORE_OK ||
            store_job_get(db, tenant_id, argv[1], &j) != STORE_OK) {
            fprintf(stderr, "idemgate: no job %s\n", argv[1]);
            goto resolved;
        }
        /* The same decision as POST /v1/jobs/ID/resolve: a task found at an async provider is
         * polled for its outputs, never completed without them. */
        const struct cfg_provider *p = cfg_find_provider(cfg, j.provider, strlen(j.provider));
        if (what == RES_FOUND && !p) {
            /* As the HTTP call's 409 provider-not-configured: what a found task becomes is
             * the provider's profile's to say (an async task completed with no outputs,
             * never polled, its cancel never sent). */
            fprintf(stderr, "idemgate: the configuration does not name the provider of %s "
                            "(%s): resolve it found with a configuration that does\n",
                    argv[1], j.provider);
            store_job_fini(&j);
            goto resolved;
        }
        enum op_state next = st_resolve_target((enum st_resolution)what,
                                               p && p->mode == CFG_MODE_ASYNC_POLL,
                                               p && p->task_path, j.cancel_requested_at != NULL);
        /* As POST /v1/jobs/ID/resolve: written only on a job read in review, under the fencing
         * token read (its remote id and webhook hint as read). */
        char hint[256] = "", seen[48] = "";
        if (j.state == ST_REVIEW && store_job_hint(db, tenant_id, argv[1], hint, sizeof(hint),
                                                   seen, sizeof(seen)) != STORE_OK) {
            fprintf(stderr, "idemgate: the job %s could not be read\n", argv[1]);
            store_job_fini(&j);
            goto resolved;
        }
        if (j.state != ST_REVIEW) {
            int same = j.resolution && !strcmp(j.resolution, outcome) &&
                       (what != RES_FOUND ||
                        (j.remote_id && remote && !strcmp(j.remote_id, remote)));
            printf("%s %s (%s)\n", j.id, st_name(j.state),
                   same ? "already resolved so" : "not in review");
            rc = same ? 0 : 1;
            store_job_fini(&j);
            goto resolved;
        }
        int has_id = (j.remote_id && *j.remote_id) || *hint;
        int refused = (has_id || *seen) &&
                      st_resend_refused((enum st_resolution)what, next, 1,
                                        has_flag(argc, argv, 3, resolve_opts, "--force"));
        if (refused) {
            fprintf(stderr, "idemgate: the provider's task for %s was seen (%s %s): absent "
                            "would %s; resolve it found with %s, abandon it, or add --force "
                            "when that task is not this job's\n",
                    argv[1],
                    j.remote_id && *j.remote_id ? "remote id"
                    : *hint                     ? "webhook hint"
                                                : st_seen_by(seen),
                    j.remote_id && *j.remote_id ? j.remote_id : *hint ? hint : seen,
                    next == ST_PREPARED ? "send it again and pay a second task"
                                        : "end it failed at no cost while its task exists",
                    has_id ? "that id" : "its id at the provider");
            store_job_fini(&j);
            goto resolved;
        }
        long long version = j.lease_version; /* written only on the job as read */
        char resolved_at[48]; /* as read: a refused write after which it is the same was ours */
        snprintf(resolved_at, sizeof(resolved_at), "%s", j.resolved_at ? j.resolved_at : "");
        store_job_fini(&j);
        if (store_resolve(db, tenant_id, tenant, argv[1], outcome, next,
                          what == RES_FOUND ? remote : NULL, op ? op : "cli", version, &j,
                          &applied) == STORE_OK) {
            /* Refused with nobody resolving it since the read: it changed under the decision
             * (an earlier resolution on the row is no replay); else the same decision (the
             * same remote id for found) applied by another: a replay. */
            int untouched = !applied && !strcmp(resolved_at, j.resolved_at ? j.resolved_at : "");
            int same = !untouched && j.resolution && !strcmp(j.resolution, outcome) &&
                       (what != RES_FOUND ||
                        (j.remote_id && remote && !strcmp(j.remote_id, remote)));
            printf("%s %s (%s)\n", j.id, st_name(j.state),
                   applied     ? "resolved"
                   : same      ? "already resolved so"
                   : untouched ? "changed while deciding: read it again"
                               : "not in review");
            rc = applied || same ? 0 : 1;
            store_job_fini(&j);
            /* This process has no signaller: the gateways are told now (or by their polls). */
            if (wake_flush(db) < 0)
                fprintf(stderr, "idemgate: the gateways could not be signalled; they will "
                                "notice at their next poll\n");
        }
    resolved:;
    } else {
        rc = jobs_usage(2);
    }
    store_db_close(db);
    return rc;
}

/* idemgate statements: every statement the gateway prepares, one JSON object per line ({name,
 * params, sql}, and sql_distributed where a distributed database is given another text), for a
 * DBA to read, EXPLAIN or plan indexes against (tests/integration/test_citus_plans.py explains
 * them on a Citus coordinator). Needs no database. */
int cli_statements(void)
{
    const struct db_stmt *const *(*const lists[])(size_t *) = {store_statements,
                                                               lease_statements,
                                                               archive_statements};
    for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++) {
        size_t n = 0;
        const struct db_stmt *const *s = lists[l](&n);
        for (size_t i = 0; i < n; i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON *ps = cJSON_AddArrayToObject(o, "params");
            cJSON_AddStringToObject(o, "name", s[i]->name);
            for (const char *const *p = s[i]->params; p && *p; p++)
                cJSON_AddItemToArray(ps, cJSON_CreateString(*p));
            cJSON_AddStringToObject(o, "sql", s[i]->sql);
            if (s[i]->sql_distributed)
                cJSON_AddStringToObject(o, "sql_distributed", s[i]->sql_distributed);
            char *line = cJSON_PrintUnformatted(o);
            if (!line) {
                cJSON_Delete(o);
                return 1;
            }
            puts(line);
            free(line);
            cJSON_Delete(o);
        }
    }
    return fflush(stdout) == 0 ? 0 : 1;
}
