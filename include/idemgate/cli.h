#ifndef IDEMGATE_CLI_H
#define IDEMGATE_CLI_H

#include "idemgate/config.h"

/* The administrative commands of the idemgate binary. Each returns a process exit status. */
/* `migrate [--citus]`: the migrations, then (--citus) the schema distributed on a Citus
 * coordinator (distribute.h). */
int cli_migrate(const struct cfg *cfg, int argc, char **argv);
int cli_tenant(const struct cfg *cfg, int argc, char **argv);
int cli_check_config(const struct cfg *cfg);
int cli_jobs(const struct cfg *cfg, int argc, char **argv);
/* `idemgate usage`: GET /v1/usage's document, for every tenant or --tenant NAME. */
int cli_usage(const struct cfg *cfg, int argc, char **argv);
/* `idemgate unreferenced SHA256...`: the archive's retention hook (store_unreferenced_sha256). */
int cli_unreferenced(const struct cfg *cfg, int argc, char **argv);
/* Prints every prepared statement as JSON lines; needs no configuration. */
int cli_statements(void);

#endif
