/* The clattn program: see cli.c. */
#define _XOPEN_SOURCE 700
#include <signal.h>

#include "cli.h"

int main(int argc, char **argv)
{
    /* A write past the file size limit (ulimit -f) then fails with EFBIG,
     * which the commands report, removing what they began, instead of the
     * signal killing the process with a temporary file left behind. */
    signal(SIGXFSZ, SIG_IGN);
    return clattn_cli_main(argc, argv);
}
