#include "idemgate/cli.h"

#include "idemgate/crypto.h"
#include "idemgate/migrate.h"
#include "idemgate/store.h"

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

int cli_migrate(const struct cfg *cfg)
{
    struct db *db = open_or_complain(cfg);
    if (!db)
        return 1;
    int e = migrate_run(db);
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

int cli_tenant(const struct cfg *cfg, int argc, char **argv)
{
    if (argc < 1 || strcmp(argv[0], "--help") == 0) {
        printf("usage: idemgate tenant add NAME | list | revoke NAME\n"
               "  add     creates a tenant and prints its bearer token once (only its SHA-256 is "
               "stored)\n"
               "  list    lists tenants\n"
               "  revoke  revokes a tenant's token at once\n");
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
    } else if (strcmp(argv[0], "revoke") == 0 && argc == 2) {
        int e = store_tenant_revoke(db, argv[1]);
        if (e == STORE_ENOTFOUND)
            fprintf(stderr, "idemgate: no live tenant named %s\n", argv[1]);
        rc = e == 0 ? 0 : 1;
    } else {
        fprintf(stderr, "idemgate: usage: idemgate tenant add NAME | list | revoke NAME\n");
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
        if (p->secret_env && !getenv(p->secret_env)) {
            fprintf(stderr, "warning: providers.%s.auth.secret_env: %s is not set\n", p->name,
                    p->secret_env);
            missing++;
        }
    }
    printf("%s: ok (%zu providers%s)\n", cfg->config_path ? cfg->config_path : "(defaults)",
           cfg->n_providers, missing ? ", secrets missing: see warnings" : "");
    return 0;
}
