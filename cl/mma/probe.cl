#ifdef LOCAL_PROBE
/* Each kernel's buffer as the kernels above index it (cl/common.cl's
 * LOCAL_PROBE_KERNEL): the most tile_base() moves the tiles on (wgmma: to
 * a 1024-byte boundary from a 4-byte one; 16-bit: to a 16-byte one), the
 * rows' values, exchange and emulation's scratch up to TILES_AT, two
 * tensors' tiles, and the single pass's K rows and dS^T. */
#if WGMMA
#define PROBE_SHIFT 255
#elif DTYPE != 0
#define PROBE_SHIFT 3
#else
#define PROBE_SHIFT 0
#endif
#define PROBE_TILES (PROBE_SHIFT + TILES_AT + 2 * BUFFERS * ROW_TILE)
LOCAL_PROBE_KERNEL(forward__mma, PROBE_TILES)
LOCAL_PROBE_KERNEL(grad_q__mma, PROBE_TILES)
LOCAL_PROBE_KERNEL(grad_k__mma, PROBE_TILES)
LOCAL_PROBE_KERNEL(grad_v__mma, PROBE_TILES)
LOCAL_PROBE_KERNEL(grad_kv__mma, PROBE_TILES)
LOCAL_PROBE_KERNEL(grad_kvs__mma, PROBE_TILES)
#if DTYPE != 0
LOCAL_PROBE_KERNEL(grad_kvq__mma, PROBE_SHIFT + DS_AT + 2 * WG_ROWS * DSW)
#endif
#endif
