/* ---- the streamed tiles' pipeline and the products, one interface ------ */

/* Every mma kernel holds its 16-row blocks in registers and streams the
 * other side through local memory a tile at a time: two tensors' tiles (K
 * and V for the query side; Q and dO for the key side, with their rows' m,
 * l and Dsum), the next tile in flight while this one is computed. A loop
 * over tiles reads
 *
 *     stream st;
 *     stream_init(&st, tiles);
 *     stream_first(&st, ...tile 0...);
 *     for (each tile) {
 *         stream_land(&st, rows);       this tile is in local memory ...
 *         stream_ready();               ... and seen by every warp
 *         if (more) stream_next(&st, ...the next tile...);
 *         products on st.xt, st.yt (and st.rows)
 *         stream_advance(&st, tiles, rows);
 *     }
 *
 * fp32 tiles are fetched into registers a tile ahead and stored (split
 * into tf32 planes) between two barriers; 16-bit tiles are copied by
 * cp.async into one of two buffers while the work-group reads the other,
 * one barrier a tile. */
typedef struct stream {
    __local float *xt, *yt; /* this tile's two tensors */
    __local float *rows;    /* its rows' m, l and Dsum: [3][TILE] (key side) */
#if DTYPE == 0
    chunk x[PER_LANE], y[PER_LANE]; /* the next tile, in registers */
    float r[3];                     /* a lane's row of it (lanes < TILE) */
#endif
} stream;

inline void stream_init(stream *st, __local float *tiles)
{
    st->xt = tiles + TILES_AT;
    st->yt = st->xt + ROW_TILE;
    st->rows = tiles + ROW_AT;
}

#if DTYPE == 0
/* Rows [p0, p0 + TILE) of x (times xscale) and y, and with `rows` their LSE
 * pairs and (want_dk) Dsum, into the registers. */
inline void stream_fetch(stream *st, __global const elem *x, float xscale,
                         __global const elem *y, __global const float *lse,
                         __global const float *dsum, bool rows, bool want_dk, uint b, uint n,
                         uint p0, uint end, uint heads, uint head)
{
    fetch_tile(st->x, x, b, n, p0, end, heads, head, xscale);
    fetch_tile(st->y, y, b, n, p0, end, heads, head, 1.0f);
    if (rows)
        fetch_rows(st->r, lse, dsum, b, n, p0, end, heads, head, want_dk);
}

/* The first tile; `any`: there is one (fp32 fetches zeros where not). */
inline void stream_first(stream *st, __local float *tiles, __global const elem *x, float xscale,
                         __global const elem *y, __global const float *lse,
                         __global const float *dsum, bool rows, bool want_dk, uint b, uint n,
                         uint p0, uint end, uint heads, uint head, bool any)
{
    stream_fetch(st, x, xscale, y, lse, dsum, rows, want_dk, b, n, p0, end, heads, head);
}

inline void stream_next(stream *st, __local float *tiles, __global const elem *x, float xscale,
                        __global const elem *y, __global const float *lse,
                        __global const float *dsum, bool rows, bool want_dk, uint b, uint n,
                        uint p0, uint end, uint heads, uint head)
{
    stream_fetch(st, x, xscale, y, lse, dsum, rows, want_dk, b, n, p0, end, heads, head);
}

/* The fetched tile into local memory, once every warp is done with the
 * last one. */
inline void stream_land(stream *st, bool rows)
{
    barrier(CLK_LOCAL_MEM_FENCE);
    store_tile(st->xt, st->x);
    store_tile(st->yt, st->y);
    const uint lid = get_local_id(0);
    if (rows && lid < TILE) {
        st->rows[lid] = st->r[0];
        st->rows[TILE + lid] = st->r[1];
        st->rows[2 * TILE + lid] = st->r[2];
    }
}

inline void stream_advance(stream *st, __local float *tiles, bool rows) {}
#else
#if WGMMA
#define COPY_KV copy_tile_sw
#else
#define COPY_KV copy_tile
#endif

/* Copies rows [p0, p0 + TILE) of x and y into the pair at xt, and with
 * `rows` their LSE pairs and (want_dk) Dsum into `to` (16-bit's Q is
 * copied unscaled: its scale is applied to the scores). */
inline void stream_copy(__local float *xt, __local float *to, __global const elem *x,
                        __global const elem *y, __global const float *lse,
                        __global const float *dsum, bool rows, bool want_dk, uint b, uint n,
                        uint p0, uint end, uint heads, uint head)
{
    COPY_KV(xt, x, b, n, p0, end, heads, head);
    COPY_KV(xt + ROW_TILE, y, b, n, p0, end, heads, head);
    if (rows)
        copy_rows(to, lse, dsum, b, n, p0, end, heads, head, want_dk);
}

/* The first tile into the current buffers, where there is one: no copy is
 * left in flight past the loop. */
inline void stream_first(stream *st, __local float *tiles, __global const elem *x, float xscale,
                         __global const elem *y, __global const float *lse,
                         __global const float *dsum, bool rows, bool want_dk, uint b, uint n,
                         uint p0, uint end, uint heads, uint head, bool any)
{
    if (any)
        stream_copy(st->xt, st->rows, x, y, lse, dsum, rows, want_dk, b, n, p0, end, heads,
                    head);
}

/* The next tile into the other buffers, read for the last tile. */
inline void stream_next(stream *st, __local float *tiles, __global const elem *x, float xscale,
                        __global const elem *y, __global const float *lse,
                        __global const float *dsum, bool rows, bool want_dk, uint b, uint n,
                        uint p0, uint end, uint heads, uint head)
{
    stream_copy(other_pair(tiles, st->xt), rows ? other_rows(tiles, st->rows) : st->rows, x, y,
                lse, dsum, rows, want_dk, b, n, p0, end, heads, head);
}

/* This lane's copies of the tile have landed; stream_ready's barrier then
 * shows everyone's, and frees the other buffers, read for the last tile. */
inline void stream_land(stream *st, bool rows) { wait_copies(); }

inline void stream_advance(stream *st, __local float *tiles, bool rows)
{
    st->xt = other_pair(tiles, st->xt);
    st->yt = st->xt + ROW_TILE;
    if (rows)
        st->rows = other_rows(tiles, st->rows);
}
#endif

/* Past it every warp sees the landed tile (wgmma reads it through the
 * async proxy, hence its fence). */
inline void stream_ready(void)
{
#if WGMMA
    wg_proxy_fence();
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* The warp's 16 x TILE block of a . x^T into s, and of c . y^T into dp
 * unless dp is NULL (a, c: its A fragments; x, y: tiles), summed over the
 * warps of its group. */
inline void scores(float *s, float *dp, const frag *a, const frag *c, __local const float *x,
                   __local const float *y, uint d0, __local float *xch, __local float *emu)
{
#if WGMMA
    wg_scores(s, a, x, dp, c, y, emu);
#else
    tile_products(s, dp, a, c, x, y, d0, xch, emu);
#endif
}

/* acc += p . x, and acc2 += p2 . x2 unless acc2 is NULL: the products that
 * update the warp's columns of the outputs, p and p2 its 16 x TILE blocks
 * of weights. */
inline void times(float *acc, const float *p, __local const float *x, float *acc2,
                  const float *p2, __local const float *x2, uint d0, __local float *emu)
{
#if WGMMA
    wg_times(acc, p, x, acc2, p2, x2, emu);
#else
    tile_times(acc, p, x, d0, emu);
    if (acc2)
        tile_times(acc2, p2, x2, d0, emu);
#endif
}

/* The forward's P V, issued and left in flight across the next tile's
 * wait on wgmma (pa holds its A fragments meanwhile); at once elsewhere. */
#if WGMMA
#define PA_STEPS (TILE / 16)
#else
#define PA_STEPS 1
#endif
inline void times_issue(float *acc, uint pa[PA_STEPS][4], const float *p,
                        __local const float *x, uint d0, __local float *emu)
{
#if WGMMA
    wg_times_issue(acc, pa, p, x, emu);
#else
    tile_times(acc, p, x, d0, emu);
#endif
}

inline void times_wait(float *acc, uint pa[PA_STEPS][4])
{
#if WGMMA
    wg_wait(acc, pa);
#endif
}
