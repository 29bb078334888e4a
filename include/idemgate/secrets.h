#ifndef IDEMGATE_SECRETS_H
#define IDEMGATE_SECRETS_H

#include <stddef.h>

/* A provider's credential by its reference — what a job's row keeps, never the secret itself:
 * the name of an environment variable (auth.secret_env), or SECRET_FILE_PREFIX and the absolute
 * path of a file (auth.secret_file) that an agent outside the gateway replaces: a Vertex AI
 * access token that lasts an hour, a key rotated by Vault or a Kubernetes secret. A file is read
 * again whenever it was replaced (another inode, size or modification time), so the next call
 * carries the new secret without a restart; one line end at its end is not part of the secret.
 * Safe from any thread; nothing here logs a secret. */
#define SECRET_FILE_PREFIX "file:"

/* The largest secret file read (bytes); a longer one is refused as unreadable. */
#define SECRET_FILE_MAX (64 * 1024)

/* The secret ref names now, as a copy to give back with secret_free; NULL when the variable is
 * unset or empty, or the file cannot be read, is empty or is longer than SECRET_FILE_MAX. A NUL
 * byte inside a file reads as a control character (prov_secret_ok refuses it). */
char *secret_get(const char *ref);

/* Whether ref names a file; the variable's name or the file's path it names (for messages). */
int secret_is_file(const char *ref);
const char *secret_name(const char *ref);

/* Wipes and frees what secret_get gave (NULL: nothing). */
void secret_free(char *s);

/* Pure: the length of n bytes of a file's content without one line end ("\n" or "\r\n") at its
 * end. */
size_t secret_trim(const char *s, size_t n);

/* Frees the files' copies kept (process exit). */
void secrets_fini(void);

#endif
