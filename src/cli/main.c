/* The clattn program: see cli.c. */
#include "cli.h"

int main(int argc, char **argv) { return clattn_cli_main(argc, argv); }
