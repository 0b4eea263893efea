/* The clattn command line: `clattn devices`, and the dispatch to each
 * command (files.c: forward, backward, grad-v, merge; demo.c; train.c;
 * bench.c; tune.c), whose shared helpers are in common.c.
 * Exit status: 0 success, 1 a device or library failure, 2 bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn.h"

#include "cli.h"

int cmd_devices(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        printf("usage: clattn devices\n"
               "Lists every OpenCL platform and device, then the native backend, and marks\n"
               "with '*' the one that auto (or CLATTN_DEVICE) picks. Select one with\n"
               "--device P:D, gpu, cpu, native or a part of its name.\n");
        return 0;
    }
    if (argc > 0) {
        fprintf(stderr, "clattn devices: unknown argument '%s'\n", argv[0]);
        return EXIT_INPUT;
    }
    size_t n = 0;
    clattn_status st = clattn_list_devices(NULL, 0, &n);
    clattn_device_info *list = st == CLATTN_OK ? calloc(n, sizeof *list) : NULL;
    if (st == CLATTN_OK && !list)
        st = CLATTN_ERROR_OUT_OF_MEMORY;
    if (st == CLATTN_OK)
        st = clattn_list_devices(list, n, &n);
    if (st != CLATTN_OK) {
        fprintf(stderr, "clattn devices: %s: %s\n", clattn_status_string(st),
                clattn_last_error());
        free(list);
        return EXIT_DEVICE;
    }
    clattn_context *ctx = NULL;
    clattn_options o = clattn_options_default();
    st = clattn_context_create(&o, &ctx);
    const char *picked = st == CLATTN_OK ? clattn_context_device(ctx) : "";
    for (size_t i = 0; i < n; ++i) {
        char idx[32] = "-", tag[40] = "";
        int mark;
        if (list[i].backend == CLATTN_BACKEND_NATIVE) {
            mark = ctx && clattn_context_backend(ctx) == CLATTN_BACKEND_NATIVE;
        } else {
            snprintf(idx, sizeof idx, "%d:%d", list[i].platform_index, list[i].device_index);
            snprintf(tag, sizeof tag, "(%s)", idx);
            mark = ctx && strstr(picked, tag) != NULL;
        }
        printf("%c %-6s %-11s %s / %s\n", mark ? '*' : ' ', idx,
               clattn_backend_name(list[i].backend), list[i].platform, list[i].name);
    }
    if (ctx)
        printf("auto picks %s\n%s", picked, clattn_context_log(ctx));
    else
        printf("auto picks nothing: %s: %s\n", clattn_status_string(st), clattn_last_error());
    clattn_context_destroy(ctx);
    free(list);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: clattn COMMAND [ARGS]   (clattn COMMAND --help for each)\n"
               "  devices   list OpenCL devices and the native backend; mark auto's pick\n"
               "  forward   attention's forward, O and the LSE pairs, on .npy files\n"
               "  backward  dQ, dK and dV from the forward's O and LSE, on .npy files\n"
               "  grad-v    the gradient of attention with respect to V, on .npy files\n"
               "  merge     two partial forwards' (O, LSE) over disjoint keys into one\n"
               "  demo      grad-V on an embedded layer, checked against native\n"
               "  train     train an embedded attention layer with Adam; the loss must fall\n"
               "            100-fold\n"
               "  bench     time ops and kernel variants side by side\n"
               "  tune      search a variant's kernel shapes on a device; keep the winner\n"
               "  version   print the library version\n"
               "The device comes from --device, else CLATTN_DEVICE, else auto.\n");
}

int clattn_cli_main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_INPUT;
    }
    const char *c = argv[1];
    if (!strcmp(c, "--help") || !strcmp(c, "-h") || !strcmp(c, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(c, "version") || !strcmp(c, "--version")) {
        printf("clattn %s\n", clattn_version());
        return 0;
    }
    if (!strcmp(c, "devices"))
        return cmd_devices(argc - 2, argv + 2);
    int rc;
    if (cmd_file_named(c, argc - 2, argv + 2, &rc))
        return rc;
    if (!strcmp(c, "merge"))
        return cmd_merge(argc - 2, argv + 2);
    if (!strcmp(c, "demo"))
        return cmd_demo(argc - 2, argv + 2);
    if (!strcmp(c, "train"))
        return cmd_train(argc - 2, argv + 2);
    if (!strcmp(c, "bench"))
        return cmd_bench(argc - 2, argv + 2);
    if (!strcmp(c, "tune"))
        return cmd_tune(argc - 2, argv + 2);
    fprintf(stderr, "clattn: unknown command '%s'\n", c);
    usage(stderr);
    return EXIT_INPUT;
}

