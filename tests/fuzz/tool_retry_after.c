/* For the differential check of Retry-After dates (tests/fuzz/diff_retry_after.py): reads lines
 * "NOW<TAB>VALUE" on stdin and prints bo_retry_after_ms(VALUE, NOW) for each, one per line. */
#include "idemgate/backoff.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void)
{
    char line[4096];
    while (fgets(line, sizeof(line), stdin)) {
        line[strcspn(line, "\n")] = '\0';
        char *tab = strchr(line, '\t');
        if (!tab) {
            printf("bad\n");
            continue;
        }
        *tab = '\0';
        printf("%lld\n", bo_retry_after_ms(tab + 1, strtoll(line, NULL, 10)));
    }
    return 0;
}
