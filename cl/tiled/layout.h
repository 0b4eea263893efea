/* tiled's local buffer, in floats: the one definition that the kernels
 * (cl/tiled/, whose program starts with this file) and the host
 * (src/opencl/variants/tiled.c, which includes it) both size it by. Plain
 * integer macros, valid C and OpenCL C. The kernels take the buffer as
 * float4s; the host rounds each total up to whole float4s. */
#ifndef CLATTN_TILED_LAYOUT_H
#define CLATTN_TILED_LAYOUT_H

/* Micro-tiles (PER_ITEM 1 to 8): rows of head_dim d padded to DS floats
 * (d rounded up to four, then four more, so that a load step's rows lie in
 * different banks), and the weights' rows, one a tile row, WS apart. */
#define TILED_DS(d) (((d) + 3) / 4 * 4 + 4)
#define TILED_WS(rows) (((rows) + 3) / 4 * 4 + 4)
/* The forward's weights take the key tile's place where they fit it; K and
 * V take turns in one buffer under one_kv. */
#define TILED_WS_IN_KS(ds, ws, one_kv) (!(one_kv) && (ws) <= (ds))
/* Each micro-tile kernel's buffer: the group's rows, the tile's rows, the
 * weights, and the forward's maxima and dropout sums, or the key side's
 * per-query values. */
#define TILED_LOCAL_FORWARD(rows, tile, split, ds, ws, one_kv)                             \
    ((rows) * (ds) +                                                                       \
     ((one_kv) ? (tile) * (ds) + (tile) * (ws)                                             \
               : 2 * (tile) * (ds) + (TILED_WS_IN_KS(ds, ws, one_kv) ? 0 : (tile) * (ws))) + \
     2 * (split) * (rows))
#define TILED_LOCAL_GRAD_Q(rows, tile, ds, ws)                                             \
    (2 * (rows) * (ds) + 2 * (tile) * (ds) + (tile) * (ws))
#define TILED_LOCAL_KEY(rows, tile, ds, ws)                                                \
    (2 * (rows) * (ds) + 2 * (tile) * (ds) + 2 * (tile) * (ws) + 3 * (tile))
#define TILED_LOCAL_GRAD_QS(tile, ds, ws) ((tile) * (ds) + (tile) * (ws)) /* grad-Q from dS */

/* Rows (PER_ITEM 0): tiles dp floats wide (head_dim padded to whole
 * column parts of dsplit work-items); two tiles and three per-row values,
 * then the partial dot products where dsplit > 1; or, where larger, the
 * split parts' accumulators (rows of dp + 2) that meet at the end. */
#define TILED_ROWS_DP(d, dsplit) (((d) + (dsplit) - 1) / (dsplit) * (dsplit))
#define TILED_ROWS_XCH_AT(tile, dp) (2 * (tile) * (dp) + 3 * (tile))
#define TILED_ROWS_XCH(rows, tile, dsplit) ((dsplit) > 1 ? 2 * (dsplit) * (tile) * (rows) : 0)
#define TILED_ROWS_COMBINE(rows, split, dp) (((split) - 1) * (rows) * ((dp) + 2))
#define TILED_LOCAL_ROWS(rows, tile, split, dsplit, dp)                                    \
    (TILED_ROWS_XCH_AT(tile, dp) + TILED_ROWS_XCH(rows, tile, dsplit) >                    \
             TILED_ROWS_COMBINE(rows, split, dp)                                           \
         ? TILED_ROWS_XCH_AT(tile, dp) + TILED_ROWS_XCH(rows, tile, dsplit)                \
         : TILED_ROWS_COMBINE(rows, split, dp))

#endif
