//! The problem a call describes: [`Shape`], built and checked by
//! [`ShapeBuilder`], with the arrays its `clattn_shape` points to.

use std::ffi::CString;
use std::os::raw::c_void;
use std::ptr;

use crate::{check, sys, Error, Result};

/// The causal mask's alignment where kv_seq != q_seq.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Causal {
    #[default]
    None,
    /// PyTorch's `is_causal`: query i sees keys 0..=i.
    TopLeft,
    /// FlashAttention's and cuDNN's: the last query sees the last key.
    BottomRight,
}

/// One attention problem: `clattn_shape`, validated when built, with the
/// arrays it points to (packed sequences' prefix sums, ALiBi slopes,
/// sinks, the caller's functions, their parameters, a bias and a bool
/// mask) owned here. The dtype comes from the slices each call takes.
#[derive(Clone, Debug)]
pub struct Shape {
    raw: sys::clattn_shape,
    cu_q: Vec<u32>,
    cu_kv: Vec<u32>,
    slopes: Vec<f32>,
    sinks: Vec<f32>,
    arrays: UserArrays,
}

/// What the caller's functions and tensors need (docs/programmable.md).
#[derive(Clone, Debug, Default)]
struct UserArrays {
    score_fn: Option<CString>,
    mask_fn: Option<CString>,
    params: Vec<f32>,
    bias: Vec<f32>,
    bool_mask: Vec<u8>,
    /// A source with a NUL byte, reported by build().
    bad_source: Option<&'static str>,
}

/// A score function's C forms, for the native backend and the host's
/// gradients: `clattn_score`, `clattn_score_ds` and, for
/// [`Context::grad_score_params`], `clattn_score_dp`
/// (`clattn_shape`'s `score_native`, `score_ds_native` and `score_dp_native`).
#[derive(Clone, Copy, Debug)]
pub struct ScoreFns {
    pub score: sys::ScoreFn,
    pub score_ds: sys::ScoreFn,
    pub score_dp: Option<sys::ParamsFn>,
}

// SAFETY: the stored struct's data pointers are always NULL (its function
// pointers are plain code): raw() points a copy at the vectors and strings
// this shape owns, which only &self reads.
unsafe impl Send for Shape {}
unsafe impl Sync for Shape {}

/// Builds a [`Shape`]: `Shape::builder(batch, q_seq, kv_seq, num_heads,
/// num_kv_heads, head_dim)`, options, then `build()`.
#[derive(Clone, Debug)]
pub struct ShapeBuilder {
    shape: Shape,
}

impl Shape {
    /// batch, q_seq and kv_seq (for packed sequences: the rows of Q and K in
    /// all; the batch comes from the prefix sums), query heads, KV heads
    /// (dividing them) and head_dim (1..=256).
    pub fn builder(
        batch: u32,
        q_seq: u32,
        kv_seq: u32,
        num_heads: u32,
        num_kv_heads: u32,
        head_dim: u32,
    ) -> ShapeBuilder {
        // SAFETY: plain data.
        let mut raw = unsafe { sys::clattn_shape_default() };
        raw.batch = batch;
        raw.q_seq = q_seq;
        raw.kv_seq = kv_seq;
        raw.num_heads = num_heads;
        raw.num_kv_heads = num_kv_heads;
        raw.head_dim = head_dim;
        ShapeBuilder { shape: Shape::of(raw) }
    }

    /// A shape of raw's fields, owning no arrays yet.
    fn of(raw: sys::clattn_shape) -> Shape {
        Shape {
            raw,
            cu_q: Vec::new(),
            cu_kv: Vec::new(),
            slopes: Vec::new(),
            sinks: Vec::new(),
            arrays: UserArrays::default(),
        }
    }

    /// meganeura's uniform block `{q_seq, kv_seq, packed_heads, head_dim,
    /// window_size, pad, pad, pad}` (`clattn_shape_from_seed`): kv_seq 0 is
    /// causal with kv_seq = q_seq; packed_heads = num_heads << 16 |
    /// num_kv_heads.
    pub fn from_seed(params: [u32; 8]) -> Result<Shape> {
        // SAFETY: plain data; the call reads 8 words.
        let mut raw = unsafe { sys::clattn_shape_default() };
        check(unsafe { sys::clattn_shape_from_seed(params.as_ptr(), &mut raw) })?;
        Ok(Shape::of(raw))
    }

    /// The C struct for a call on elements of `dtype`, pointing into self.
    pub fn raw(&self, dtype: sys::clattn_dtype) -> sys::clattn_shape {
        let mut s = self.raw;
        s.dtype = dtype;
        let arr = |v: &Vec<f32>| if v.is_empty() { ptr::null() } else { v.as_ptr() };
        s.alibi_slopes = arr(&self.slopes);
        s.sinks = arr(&self.sinks);
        if !self.cu_q.is_empty() {
            s.cu_seqlens_q = self.cu_q.as_ptr();
            s.cu_seqlens_kv = self.cu_kv.as_ptr();
        }
        let a = &self.arrays;
        let text = |c: &Option<CString>| c.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        s.score_fn = text(&a.score_fn);
        s.mask_fn = text(&a.mask_fn);
        s.score_params = arr(&a.params);
        s.bias = if a.bias.is_empty() { ptr::null() } else { a.bias.as_ptr() as *const c_void };
        s.bool_mask = if a.bool_mask.is_empty() { ptr::null() } else { a.bool_mask.as_ptr() };
        s
    }

    /// The elements of the bias's (or bool mask's) layout:
    /// bias_batch x bias_heads x q_seq x kv_seq.
    pub fn bias_len(&self) -> usize {
        let r = &self.raw;
        [r.bias_batch.max(1), r.bias_heads.max(1), r.q_seq, r.kv_seq]
            .iter()
            .fold(1usize, |n, &x| n.saturating_mul(x as usize))
    }

    /// The score function's parameters: how many.
    pub fn score_params_len(&self) -> usize {
        self.arrays.params.len()
    }

    pub fn batch(&self) -> u32 {
        self.raw.batch
    }
    pub fn q_seq(&self) -> u32 {
        self.raw.q_seq
    }
    pub fn kv_seq(&self) -> u32 {
        self.raw.kv_seq
    }
    pub fn num_heads(&self) -> u32 {
        self.raw.num_heads
    }
    pub fn num_kv_heads(&self) -> u32 {
        self.raw.num_kv_heads
    }
    pub fn head_dim(&self) -> u32 {
        self.raw.head_dim
    }
    pub fn packed(&self) -> bool {
        !self.cu_q.is_empty()
    }

    fn rows(&self, seq: u32) -> usize {
        if self.packed() {
            seq as usize
        } else {
            self.raw.batch as usize * seq as usize
        }
    }

    /// Elements of Q, O, dO and dQ.
    pub fn q_len(&self) -> usize {
        self.rows(self.raw.q_seq) * self.raw.num_heads as usize * self.raw.head_dim as usize
    }

    /// Elements of K, V, dK and dV.
    pub fn kv_len(&self) -> usize {
        self.rows(self.raw.kv_seq) * self.raw.num_kv_heads as usize * self.raw.head_dim as usize
    }

    /// Floats of the LSE pairs.
    pub fn lse_len(&self) -> usize {
        self.rows(self.raw.q_seq) * self.raw.num_heads as usize * 2
    }

    /// The visible (query, key) pairs summed over heads and batch.
    pub fn visible_pairs(&self) -> u64 {
        let s = self.raw(sys::CLATTN_DTYPE_F32);
        // SAFETY: a validated shape pointing into self.
        unsafe { sys::clattn_shape_visible_pairs(&s) }
    }

    /// The dropout mask of batch element (or packed sequence) b and query
    /// head `head`: 1 where (query row, key) is kept, row-major over that
    /// element's q_len x kv_len; visibility not applied.
    pub fn dropout_mask(&self, b: u32, head: u32) -> Result<Vec<u8>> {
        let (q_len, kv_len) = if self.packed() {
            let i = b as usize;
            if i + 1 >= self.cu_q.len() {
                return Err(Error::new(
                    sys::CLATTN_ERROR_INVALID_OPTION,
                    format!("b {b} is past the {} sequences", self.cu_q.len() - 1),
                ));
            }
            (self.cu_q[i + 1] - self.cu_q[i], self.cu_kv[i + 1] - self.cu_kv[i])
        } else {
            (self.raw.q_seq, self.raw.kv_seq)
        };
        let n = (q_len as usize).checked_mul(kv_len as usize).ok_or_else(|| {
            Error::new(sys::CLATTN_ERROR_SIZE_OVERFLOW, "the mask's size overflows usize")
        })?;
        let mut keep = Vec::new();
        keep.try_reserve_exact(n).map_err(|_| {
            Error::new(
                sys::CLATTN_ERROR_OUT_OF_MEMORY,
                format!("out of memory for a {q_len} x {kv_len} mask"),
            )
        })?;
        keep.resize(n, 0u8);
        let s = self.raw(sys::CLATTN_DTYPE_F32);
        // SAFETY: keep holds the element's q_len * kv_len entries; b and head
        // are checked by the call before it writes.
        check(unsafe { sys::clattn_dropout_mask(&s, b, head, keep.as_mut_ptr()) })?;
        Ok(keep)
    }
}

impl ShapeBuilder {
    pub fn causal(mut self, causal: Causal) -> Self {
        self.shape.raw.causal = match causal {
            Causal::None => 0,
            Causal::TopLeft => sys::CLATTN_CAUSAL_TOP_LEFT,
            Causal::BottomRight => sys::CLATTN_CAUSAL_BOTTOM_RIGHT,
        };
        self
    }

    /// Keys less than `window` before the query are visible (0: no window).
    pub fn window(mut self, window: u32) -> Self {
        self.shape.raw.window = window;
        self
    }

    /// With a causal mask, keys up to `right` past the query are visible too.
    pub fn window_right(mut self, right: u32) -> Self {
        self.shape.raw.window_right = right;
        self
    }

    /// The scores' scale (default 1 / sqrt(head_dim)).
    pub fn scale(mut self, scale: f32) -> Self {
        self.shape.raw.scale = scale;
        self
    }

    /// Global positions of the first query and the first key.
    pub fn offsets(mut self, q_offset: u32, kv_offset: u32) -> Self {
        self.shape.raw.q_offset = q_offset;
        self.shape.raw.kv_offset = kv_offset;
        self
    }

    /// The backward ops add into their outputs instead of overwriting them.
    pub fn accumulate(mut self, on: bool) -> Self {
        self.shape.raw.accumulate = on as i32;
        self
    }

    /// Packed variable-length sequences: batch + 1 prefix sums each, from 0;
    /// the batch becomes their count.
    pub fn packed(mut self, cu_seqlens_q: &[u32], cu_seqlens_kv: &[u32]) -> Self {
        self.shape.cu_q = cu_seqlens_q.to_vec();
        self.shape.cu_kv = cu_seqlens_kv.to_vec();
        self
    }

    /// Caps scores at `c * tanh(s / c)` (0: none).
    pub fn softcap(mut self, cap: f32) -> Self {
        self.shape.raw.softcap = cap;
        self
    }

    /// ALiBi: one slope per query head.
    pub fn alibi_slopes(mut self, slopes: &[f32]) -> Self {
        self.shape.slopes = slopes.to_vec();
        self
    }

    /// Learnable sinks: one logit per query head that joins each row's
    /// softmax with no value (the forward reads them).
    pub fn sinks(mut self, sinks: &[f32]) -> Self {
        self.shape.sinks = sinks.to_vec();
        self
    }

    /// Dropout of the attention probabilities with the mask drawn from
    /// (seed, offset): the same on every device.
    pub fn dropout(mut self, p: f32, seed: u64, offset: u64) -> Self {
        self.shape.raw.dropout_p = p;
        self.shape.raw.dropout_seed = seed;
        self.shape.raw.dropout_offset = offset;
        self
    }

    /// A score function (docs/programmable.md): `source`, OpenCL C that
    /// defines `clattn_score` and `clattn_score_ds` (and `clattn_score_dp`
    /// for the parameters' gradient), which the OpenCL backends compile in;
    /// `native`, the same functions in C's form for the native backend and
    /// the host's gradients (None: OpenCL only); `params`, their `p`.
    pub fn score_fn(mut self, source: &str, native: Option<ScoreFns>, params: &[f32]) -> Self {
        let a = &mut self.shape.arrays;
        a.score_fn = CString::new(source).ok();
        if a.score_fn.is_none() {
            a.bad_source = Some("score_fn");
        }
        a.params = params.to_vec();
        let r = &mut self.shape.raw;
        r.score_native = native.map(|f| f.score);
        r.score_ds_native = native.map(|f| f.score_ds);
        r.score_dp_native = native.and_then(|f| f.score_dp);
        r.score_params_count = params.len() as u32;
        self
    }

    /// A mask function: `source`, OpenCL C that defines `clattn_mask`
    /// (false hides the pair; hidden blocks are skipped); `native`, its C
    /// form (None: OpenCL only).
    pub fn mask_fn(mut self, source: &str, native: Option<sys::MaskFn>) -> Self {
        let a = &mut self.shape.arrays;
        a.mask_fn = CString::new(source).ok();
        if a.mask_fn.is_none() {
            a.bad_source = Some("mask_fn");
        }
        self.shape.raw.mask_native = native;
        self
    }

    /// An additive float32 bias of the layout `[bias_batch][bias_heads]
    /// [q_seq][kv_seq]` (bias_batch 1 or batch, bias_heads 1 or num_heads:
    /// a dimension of 1 is broadcast), added after the score function;
    /// [`Context::grad_bias`] gives its gradient.
    pub fn bias(mut self, bias: &[f32], bias_batch: u32, bias_heads: u32) -> Self {
        self.shape.arrays.bias = bias.to_vec();
        self.shape.raw.bias_batch = bias_batch;
        self.shape.raw.bias_heads = bias_heads;
        self
    }

    /// A bool mask of the bias's layout (the same dimensions as a bias
    /// given with it): 0 hides the pair.
    pub fn bool_mask(mut self, keep: &[u8], bias_batch: u32, bias_heads: u32) -> Self {
        self.shape.arrays.bool_mask = keep.to_vec();
        self.shape.raw.bias_batch = bias_batch;
        self.shape.raw.bias_heads = bias_heads;
        self
    }

    /// The shape, checked as the library checks it (`clattn_shape_validate`).
    pub fn build(self) -> Result<Shape> {
        let mut shape = self.shape;
        let heads = shape.raw.num_heads as usize;
        if let Some(what) = shape.arrays.bad_source {
            return Err(Error::new(
                sys::CLATTN_ERROR_INVALID_MODIFIER,
                format!("{what} holds a NUL byte"),
            ));
        }
        let want = shape.bias_len();
        for (name, have) in
            [("bias", shape.arrays.bias.len()), ("bool_mask", shape.arrays.bool_mask.len())]
        {
            if have != 0 && have != want {
                return Err(Error::new(
                    sys::CLATTN_ERROR_INVALID_BUFFER,
                    format!("{name} holds {have} elements; its layout wants {want}"),
                ));
            }
        }
        for (name, v) in [("alibi_slopes", &shape.slopes), ("sinks", &shape.sinks)] {
            if !v.is_empty() && v.len() != heads {
                return Err(Error::new(
                    sys::CLATTN_ERROR_INVALID_MODIFIER,
                    format!("{name} holds {} values; the shape has {heads} query heads", v.len()),
                ));
            }
        }
        if !shape.cu_q.is_empty() || !shape.cu_kv.is_empty() {
            if shape.cu_q.len() != shape.cu_kv.len() || shape.cu_q.len() < 2 {
                return Err(Error::new(
                    sys::CLATTN_ERROR_INVALID_SEQLENS,
                    format!(
                        "cu_seqlens_q holds {} and cu_seqlens_kv {} entries: both batch + 1 >= 2",
                        shape.cu_q.len(),
                        shape.cu_kv.len()
                    ),
                ));
            }
            shape.raw.batch = (shape.cu_q.len() - 1) as u32;
        }
        let s = shape.raw(sys::CLATTN_DTYPE_F32);
        // SAFETY: the arrays hold num_heads and batch + 1 entries, as checked.
        check(unsafe { sys::clattn_shape_validate(&s) })?;
        Ok(shape)
    }
}
