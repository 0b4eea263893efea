/* What each kernel slot takes: its tensors in argument order, whether its
 * rows are queries or keys, and tree's local floats per lane. Read by the
 * launches (launch.c) and tree's sizing (variants/tree.c). */
#include "opencl.h"

const kernel_desc clattn_ocl_kernel_descs[K_COUNT] = {
    [K_GRAD_V] = {{CLATTN_R_DO, CLATTN_R_Q, CLATTN_R_K, CLATTN_R_LSE, CLATTN_R_DV}, 5, 1, 1},
    [K_FORWARD] = {{CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V, CLATTN_R_O, CLATTN_R_LSE}, 5, 0, 1},
    [K_DSUM] = {{CLATTN_R_DO, CLATTN_R_O, R_DSUM}, 3, 0, 1},
    [K_GRAD_Q] = {{CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V, CLATTN_R_DO, CLATTN_R_LSE, R_DSUM,
                   CLATTN_R_DQ}, 7, 0, 2},
    [K_GRAD_K] = {{CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V, CLATTN_R_DO, CLATTN_R_LSE, R_DSUM,
                   CLATTN_R_DK}, 7, 1, 2},
    [K_GRAD_KV] = {{CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V, CLATTN_R_DO, CLATTN_R_LSE, R_DSUM,
                    CLATTN_R_DK, CLATTN_R_DV}, 8, 1, 2},
    [K_GRAD_KVQ] = {{CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V, CLATTN_R_DO, CLATTN_R_LSE, R_DSUM,
                     CLATTN_R_DK, CLATTN_R_DV, R_DQ32}, 9, 1, 2},
    [K_FINISH_DQ] = {{R_DQ32, CLATTN_R_DQ}, 2, 0, 1},
    [K_GRAD_KVS] = {{CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V, CLATTN_R_DO, CLATTN_R_LSE, R_DSUM,
                     CLATTN_R_DK, CLATTN_R_DV, R_DS}, 9, 1, 2},
    [K_GRAD_QS] = {{CLATTN_R_K, R_DS, CLATTN_R_DQ}, 3, 0, 2},
    [K_SUM_PARTS] = {{R_PARTS_K, R_PARTS_V, CLATTN_R_DK, CLATTN_R_DV}, 4, 1, 1},
    [K_GRAD_BIAS] = {{CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V, CLATTN_R_DO, CLATTN_R_LSE, R_DSUM,
                      R_DBIAS}, 7, 0, 0},
    [K_GRAD_PARAMS] = {{CLATTN_R_Q, CLATTN_R_K, CLATTN_R_V, CLATTN_R_DO, CLATTN_R_LSE, R_DSUM,
                        R_DPARAMS}, 7, 0, 0},
};
