/* mma's local buffer, in floats: the one definition that the kernels
 * (cl/mma/, whose program starts with this file) and the host
 * (src/opencl/variants/mma.c, which includes it) both size it by. Plain
 * integer macros, valid C and OpenCL C; `sixteen` is 1 for 16-bit tensors,
 * dp head_dim padded to whole k-steps of every warp that shares a row. */
#ifndef CLATTN_MMA_LAYOUT_H
#define CLATTN_MMA_LAYOUT_H

#define MMA_KSTEP(sixteen) ((sixteen) ? 16 : 8)
#define MMA_DP(d, sixteen, wsplit)                                                         \
    (((d) + MMA_KSTEP(sixteen) * (wsplit) - 1) / (MMA_KSTEP(sixteen) * (wsplit)) *         \
     (MMA_KSTEP(sixteen) * (wsplit)))
/* fp32's tiles and rows are one of each, stored from registers fetched a
 * tile ahead; 16-bit ones two, copied into one while the other is read. */
#define MMA_BUFFERS(sixteen) ((sixteen) ? 2 : 1)
/* A tile of `tile` rows: fp32, planes of [tile][dp + 4] floats; 16-bit,
 * [tile][dp / 2 + 4] words of two elements (wgmma's unpadded rows take
 * dp / 2 of them). */
#define MMA_ROW_TILE(sixteen, planes, tile, dp)                                            \
    ((sixteen) ? (tile) * ((dp) / 2 + 4) : (planes) * (tile) * ((dp) + 4))
/* The warps' partial S and dP blocks, where warps split head_dim. */
#define MMA_XCH_FLOATS(warps, wsplit, tile) ((wsplit) > 1 ? 2 * (warps) * ((tile) / 8) * 4 * 32 : 0)
/* The emulation's scratch a warp: A 16 x 16 (fp32: 16 x 8), B 16 x 8
 * (8 x 8), and a warp's shuffle. */
#define MMA_EMU_FLOATS(sixteen) ((sixteen) ? 416 : 224)
/* Where the tiles start: m, l and Dsum of a tile's rows, the exchange,
 * the emulation's scratch (emulate 1). */
#define MMA_TILES_AT(sixteen, warps, wsplit, tile, emulate)                                \
    (3 * (tile) * MMA_BUFFERS(sixteen) + MMA_XCH_FLOATS(warps, wsplit, tile) +              \
     ((emulate) ? (warps) * MMA_EMU_FLOATS(sixteen) : 0))
/* The single pass past the tiles: K's rows of the work-group, and two
 * buffers of its keys' dS^T, by rows of keys. */
#define MMA_SINGLE_FLOATS(warps, wsplit, tile, dp)                                         \
    (16 * (warps) / (wsplit) * ((dp) / 2 + 4 + 2 * ((tile) / 2 + 4)))
/* 16-bit tiles start at the buffer's first 16-byte boundary (up to 3
 * floats on), wgmma's at a 1024-byte one (up to 255): the host gives that
 * much more. */
#define MMA_ALIGN 3
#define MMA_ALIGN_WGMMA 256
/* A kernel's buffer, alignment to 16 bytes included (single: the single
 * pass's kernel). */
#define MMA_LOCAL_FLOATS(sixteen, warps, wsplit, tile, planes, dp, emulate, single)        \
    (MMA_ALIGN + MMA_TILES_AT(sixteen, warps, wsplit, tile, emulate) +                     \
     2 * MMA_BUFFERS(sixteen) * MMA_ROW_TILE(sixteen, planes, tile, dp) +                  \
     ((single) ? MMA_SINGLE_FLOATS(warps, wsplit, tile, dp) : 0))

#endif
