/* The command line's commands, each in its file, and the dispatcher
 * (cli.c) above them; their helpers are in common.h. */
#ifndef CLATTN_CLI_H
#define CLATTN_CLI_H

#include "common.h"

int cmd_devices(int argc, char **argv);
/* The file commands (forward, backward, grad-v), by name; 0 when name is
 * none of them, else the exit status, in *rc. */
int cmd_file_named(const char *name, int argc, char **argv, int *rc);
int cmd_merge(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tune(int argc, char **argv);
/* The whole command line; main() calls it, and so does the fuzzer. */
int clattn_cli_main(int argc, char **argv);

#endif
