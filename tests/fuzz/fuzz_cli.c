/* libFuzzer target: the command line's argument parsing. The input is
 * split at NUL bytes into arguments for grad-v, forward or backward (the
 * commands that only read files), run in an empty folder so that every
 * path fails to open; nothing may crash, and the status is 0, 1 or 2.
 * Run with -close_fd_mask=3: the CLI's messages would drown the fuzzer's. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int clattn_cli_main(int argc, char **argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char dir[] = "/tmp/clattn-fuzz-XXXXXX";
    if (!mkdtemp(dir) || chdir(dir) != 0)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const cmds[] = {"grad-v", "forward", "backward"};
    if (size < 1 || size > 4096)
        return 0;
    char *text = malloc(size + 1);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    char *argv[66] = {"clattn", (char *)cmds[data[0] % 3]};
    int argc = 2;
    for (size_t i = 0; i < size - 1 && argc < 65;) {
        argv[argc++] = text + i;
        i += strlen(text + i) + 1;
    }
    argv[argc] = NULL;
    int rc = clattn_cli_main(argc, argv);
    free(text);
    if (rc < 0 || rc > 2)
        abort();
    return 0;
}
