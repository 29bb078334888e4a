#include "idemgate/retention.h"

int ret_more(const long long deleted[RET__KINDS], int batch, int round, int max_rounds)
{
    if (round >= max_rounds || batch < 1)
        return 0;
    for (int k = 0; k < RET__KINDS; k++)
        if (deleted[k] >= batch)
            return 1;
    return 0;
}
