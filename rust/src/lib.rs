//! clattn from Rust: attention training (the forward with its log-sum-exp
//! pairs, dQ, dK and dV) on any OpenCL device, PoCL on the CPU, or the
//! library's plain-C backend, through a safe API over the static library.
//!
//! ```no_run
//! use clattn::{Causal, Context, Options, Shape};
//!
//! let ctx = Context::new(&Options::default())?;
//! let shape = Shape::builder(1, 128, 128, 8, 2, 64).causal(Causal::TopLeft).build()?;
//! let q = vec![0.1f32; shape.q_len()];
//! let (k, v) = (vec![0.2f32; shape.kv_len()], vec![0.3f32; shape.kv_len()]);
//! let mut o = vec![0.0f32; shape.q_len()];
//! let mut lse = vec![0.0f32; shape.lse_len()];
//! ctx.forward(&shape, &q, &k, &v, &mut o, &mut lse)?;
//! # Ok::<(), clattn::Error>(())
//! ```
//!
//! Tensors are row-major slices: Q, O, dO and dQ `[batch][q_seq][num_heads]
//! [head_dim]`, K, V, dK and dV `[batch][kv_seq][num_kv_heads][head_dim]`,
//! the LSE pairs `[batch][q_seq][num_heads][2]` float32 (packed sequences
//! drop the batch dimension). Elements are `f32`, [`F16`] or [`Bf16`].
//! Every call checks each slice's length against the shape first; a bad
//! argument is an [`Error`], never a panic.

pub mod sys;

use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::{c_char, c_void};
use std::ptr::{self, NonNull};

/// A failed call: the library's status and its message for that failure
/// (`clattn_last_error()`), or a check the crate made before calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: sys::clattn_status,
    message: String,
}

impl Error {
    fn new(status: sys::clattn_status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    /// The `clattn_status` value, e.g. 22 for `CLATTN_ERROR_INVALID_MODIFIER`.
    pub fn status(&self) -> i32 {
        self.status
    }

    /// The status's name, e.g. `"CLATTN_ERROR_ZERO_SIZE"`.
    pub fn status_name(&self) -> String {
        // SAFETY: the library returns a static string for every value.
        unsafe { text(sys::clattn_status_string(self.status)) }
    }

    /// What exactly went wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status_name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// A C string owned by the library, copied; "" for NULL.
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

fn check(status: sys::clattn_status) -> Result<()> {
    if status == sys::CLATTN_OK {
        Ok(())
    } else {
        // SAFETY: the message of this thread's last failure, copied at once.
        Err(Error::new(status, unsafe { text(sys::clattn_last_error()) }))
    }
}

/// The library's version, "MAJOR.MINOR.PATCH".
pub fn version() -> String {
    // SAFETY: a static string.
    unsafe { text(sys::clattn_version()) }
}

/// Which backend a context runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// An OpenCL GPU, else an OpenCL CPU device, else native.
    #[default]
    Auto,
    OpenClGpu,
    OpenClCpu,
    /// Plain C, threaded; needs no OpenCL device.
    Native,
}

impl Backend {
    fn raw(self) -> sys::clattn_backend {
        match self {
            Backend::Auto => sys::CLATTN_BACKEND_AUTO,
            Backend::OpenClGpu => sys::CLATTN_BACKEND_OPENCL_GPU,
            Backend::OpenClCpu => sys::CLATTN_BACKEND_OPENCL_CPU,
            Backend::Native => sys::CLATTN_BACKEND_NATIVE,
        }
    }

    fn from_raw(b: sys::clattn_backend) -> Backend {
        match b {
            sys::CLATTN_BACKEND_OPENCL_GPU => Backend::OpenClGpu,
            sys::CLATTN_BACKEND_OPENCL_CPU => Backend::OpenClCpu,
            sys::CLATTN_BACKEND_NATIVE => Backend::Native,
            _ => Backend::Auto,
        }
    }

    /// "auto", "opencl-gpu", "opencl-cpu" or "native".
    pub fn name(self) -> String {
        // SAFETY: a static string.
        unsafe { text(sys::clattn_backend_name(self.raw())) }
    }
}

/// How a context is made: `clattn_options`.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub backend: Backend,
    /// A device selector, which overrides `backend`: "auto", "gpu", "cpu",
    /// "native", "P:D" or part of an OpenCL device's name. None: the
    /// `CLATTN_DEVICE` environment variable with `Backend::Auto`.
    pub device: Option<String>,
    /// A kernel variant by name ("mma", "tiled", "blocked", "tree"); None:
    /// the device's default.
    pub variant: Option<String>,
    /// Threads of the native backend; 0: `CLATTN_NUM_THREADS`, else every CPU.
    pub num_threads: u32,
}

fn c_string(what: &str, s: &Option<String>) -> Result<Option<CString>> {
    match s {
        None => Ok(None),
        Some(s) => CString::new(s.as_str()).map(Some).map_err(|_| {
            Error::new(sys::CLATTN_ERROR_INVALID_OPTION, format!("{what} {s:?} holds a NUL byte"))
        }),
    }
}

/// A backend and device with its built kernels: `clattn_context`. Calls on
/// one context take turns on its lock, so it may be shared by threads.
pub struct Context {
    raw: NonNull<sys::clattn_context>,
}

// SAFETY: the C contract: every function may be called from any thread,
// and calls on one context are serialised by its lock.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: made by clattn_context_create, destroyed once.
        unsafe { sys::clattn_context_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Context({:?}, variant {:?})", self.device(), self.variant())
    }
}

/// Checks each slice's length: (name, have, want).
fn check_lengths(lengths: &[(&str, usize, usize)]) -> Result<()> {
    for &(name, have, want) in lengths {
        if have != want {
            return Err(Error::new(
                sys::CLATTN_ERROR_INVALID_BUFFER,
                format!("{name} holds {have} elements; the shape wants {want}"),
            ));
        }
    }
    Ok(())
}

impl Context {
    /// `clattn_context_create`: picks the backend and device and builds the
    /// first kernels.
    pub fn new(options: &Options) -> Result<Context> {
        let device = c_string("device", &options.device)?;
        let variant = c_string("variant", &options.variant)?;
        if options.num_threads > i32::MAX as u32 {
            return Err(Error::new(
                sys::CLATTN_ERROR_INVALID_OPTION,
                format!("num_threads {} is too many", options.num_threads),
            ));
        }
        // SAFETY: plain data; the strings outlive the call, which reads them
        // during the call only.
        unsafe {
            let mut o = sys::clattn_options_default();
            o.backend = options.backend.raw();
            o.device = device.as_ref().map_or(ptr::null(), |s| s.as_ptr());
            o.variant = variant.as_ref().map_or(ptr::null(), |s| s.as_ptr());
            o.num_threads = options.num_threads as i32;
            let mut raw = ptr::null_mut();
            check(sys::clattn_context_create(&o, &mut raw))?;
            NonNull::new(raw)
                .map(|raw| Context { raw })
                .ok_or_else(|| Error::new(sys::CLATTN_ERROR_OUT_OF_MEMORY, "no context returned"))
        }
    }

    /// A context on the device a selector names ("native", "cpu", "gpu", ...).
    pub fn on(device: &str) -> Result<Context> {
        Context::new(&Options { device: Some(device.to_string()), ..Options::default() })
    }

    /// The raw handle, for `sys` calls; still owned by this context.
    pub fn as_raw(&self) -> *mut sys::clattn_context {
        self.raw.as_ptr()
    }

    pub fn backend(&self) -> Backend {
        // SAFETY: a live context.
        Backend::from_raw(unsafe { sys::clattn_context_backend(self.raw.as_ptr()) })
    }

    /// "opencl-cpu: Portable Computing Language / ...", "native: ...".
    pub fn device(&self) -> String {
        // SAFETY: a live context; the string is copied at once.
        unsafe { text(sys::clattn_context_device(self.raw.as_ptr())) }
    }

    pub fn variant(&self) -> String {
        // SAFETY: as device().
        unsafe { text(sys::clattn_context_variant(self.raw.as_ptr())) }
    }

    /// The kernels the last successful op ran, comma-separated.
    pub fn kernels(&self) -> String {
        // SAFETY: as device().
        unsafe { text(sys::clattn_context_kernels(self.raw.as_ptr())) }
    }

    /// What creation tried, and the tuning file's use.
    pub fn log(&self) -> String {
        // SAFETY: as device().
        unsafe { text(sys::clattn_context_log(self.raw.as_ptr())) }
    }

    /// O and the LSE pairs of the forward.
    pub fn forward<T: Element>(
        &self,
        shape: &Shape,
        q: &[T],
        k: &[T],
        v: &[T],
        o: &mut [T],
        lse: &mut [f32],
    ) -> Result<()> {
        let (nq, nkv, nl) = (shape.q_len(), shape.kv_len(), shape.lse_len());
        check_lengths(&[
            ("q", q.len(), nq),
            ("k", k.len(), nkv),
            ("v", v.len(), nkv),
            ("o", o.len(), nq),
            ("lse", lse.len(), nl),
        ])?;
        let s = shape.raw(T::DTYPE);
        // SAFETY: every slice holds what the shape says the call touches.
        check(unsafe {
            sys::clattn_forward(self.as_raw(), &s, cv(q), cv(k), cv(v), mv(o), lse.as_mut_ptr())
        })
    }

    /// dQ, dK and dV from the forward's O and LSE and the output gradient dO
    /// (added to the outputs with [`ShapeBuilder::accumulate`]).
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: Element>(
        &self,
        shape: &Shape,
        q: &[T],
        k: &[T],
        v: &[T],
        o: &[T],
        lse: &[f32],
        d_out: &[T],
        dq: &mut [T],
        dk: &mut [T],
        dv: &mut [T],
    ) -> Result<()> {
        check_grad_inputs(shape, q, k, v, o, lse, d_out)?;
        let (nq, nkv) = (shape.q_len(), shape.kv_len());
        check_lengths(&[("dq", dq.len(), nq), ("dk", dk.len(), nkv), ("dv", dv.len(), nkv)])?;
        let s = shape.raw(T::DTYPE);
        // SAFETY: as forward().
        check(unsafe {
            sys::clattn_backward(
                self.as_raw(),
                &s,
                cv(q),
                cv(k),
                cv(v),
                cv(o),
                lse.as_ptr(),
                cv(d_out),
                mv(dq),
                mv(dk),
                mv(dv),
            )
        })
    }

    /// dQ alone, as [`Context::backward`] computes it.
    #[allow(clippy::too_many_arguments)]
    pub fn grad_q<T: Element>(
        &self,
        shape: &Shape,
        q: &[T],
        k: &[T],
        v: &[T],
        o: &[T],
        lse: &[f32],
        d_out: &[T],
        dq: &mut [T],
    ) -> Result<()> {
        let want = shape.q_len();
        self.grad_one(sys::clattn_grad_q, ("dq", want), shape, q, k, v, o, lse, d_out, dq)
    }

    /// dK alone, as [`Context::backward`] computes it.
    #[allow(clippy::too_many_arguments)]
    pub fn grad_k<T: Element>(
        &self,
        shape: &Shape,
        q: &[T],
        k: &[T],
        v: &[T],
        o: &[T],
        lse: &[f32],
        d_out: &[T],
        dk: &mut [T],
    ) -> Result<()> {
        let want = shape.kv_len();
        self.grad_one(sys::clattn_grad_k, ("dk", want), shape, q, k, v, o, lse, d_out, dk)
    }

    /// grad_q and grad_k: `f` reads what the backward reads and writes one
    /// gradient, `out` (named and sized by `out_len`).
    #[allow(clippy::too_many_arguments)]
    fn grad_one<T: Element>(
        &self,
        f: GradOne,
        out_len: (&'static str, usize),
        shape: &Shape,
        q: &[T],
        k: &[T],
        v: &[T],
        o: &[T],
        lse: &[f32],
        d_out: &[T],
        out: &mut [T],
    ) -> Result<()> {
        check_grad_inputs(shape, q, k, v, o, lse, d_out)?;
        check_lengths(&[(out_len.0, out.len(), out_len.1)])?;
        let s = shape.raw(T::DTYPE);
        // SAFETY: as forward().
        check(unsafe {
            f(self.as_raw(), &s, cv(q), cv(k), cv(v), cv(o), lse.as_ptr(), cv(d_out), mv(out))
        })
    }

    /// dV from dO, Q, K and the LSE pairs: the seed's kernel.
    pub fn grad_v<T: Element>(
        &self,
        shape: &Shape,
        d_out: &[T],
        q: &[T],
        k: &[T],
        lse: &[f32],
        dv: &mut [T],
    ) -> Result<()> {
        let (nq, nkv, nl) = (shape.q_len(), shape.kv_len(), shape.lse_len());
        check_lengths(&[
            ("d_out", d_out.len(), nq),
            ("q", q.len(), nq),
            ("k", k.len(), nkv),
            ("lse", lse.len(), nl),
            ("dv", dv.len(), nkv),
        ])?;
        let s = shape.raw(T::DTYPE);
        // SAFETY: as forward().
        check(unsafe {
            sys::clattn_grad_v(self.as_raw(), &s, cv(d_out), cv(q), cv(k), lse.as_ptr(), mv(dv))
        })
    }

    /// The sinks' gradient (one float per query head) from the forward's O
    /// and LSE, run with [`ShapeBuilder::sinks`], and dO.
    pub fn grad_sinks<T: Element>(
        &self,
        shape: &Shape,
        o: &[T],
        lse: &[f32],
        d_out: &[T],
        d_sinks: &mut [f32],
    ) -> Result<()> {
        let (nq, nl) = (shape.q_len(), shape.lse_len());
        check_lengths(&[
            ("o", o.len(), nq),
            ("lse", lse.len(), nl),
            ("d_out", d_out.len(), nq),
            ("d_sinks", d_sinks.len(), shape.num_heads() as usize),
        ])?;
        let s = shape.raw(T::DTYPE);
        // SAFETY: as forward().
        check(unsafe {
            sys::clattn_grad_sinks(
                self.as_raw(),
                &s,
                cv(o),
                lse.as_ptr(),
                cv(d_out),
                d_sinks.as_mut_ptr(),
            )
        })
    }

    /// The forward over the union of two disjoint key sets from the
    /// forwards over each: uses the shape's batch, q_seq, num_heads and
    /// head_dim.
    #[allow(clippy::too_many_arguments)]
    pub fn merge<T: Element>(
        &self,
        shape: &Shape,
        o1: &[T],
        lse1: &[f32],
        o2: &[T],
        lse2: &[f32],
        o: &mut [T],
        lse: &mut [f32],
    ) -> Result<()> {
        let (nq, nl) = (shape.q_len(), shape.lse_len());
        check_lengths(&[
            ("o1", o1.len(), nq),
            ("lse1", lse1.len(), nl),
            ("o2", o2.len(), nq),
            ("lse2", lse2.len(), nl),
            ("o", o.len(), nq),
            ("lse", lse.len(), nl),
        ])?;
        let s = shape.raw(T::DTYPE);
        // SAFETY: as forward().
        check(unsafe {
            sys::clattn_merge(
                self.as_raw(),
                &s,
                cv(o1),
                lse1.as_ptr(),
                cv(o2),
                lse2.as_ptr(),
                mv(o),
                lse.as_mut_ptr(),
            )
        })
    }

    /// [`Context::merge`] into the first partial, in place.
    pub fn merge_into<T: Element>(
        &self,
        shape: &Shape,
        o1: &mut [T],
        lse1: &mut [f32],
        o2: &[T],
        lse2: &[f32],
    ) -> Result<()> {
        let (nq, nl) = (shape.q_len(), shape.lse_len());
        check_lengths(&[
            ("o1", o1.len(), nq),
            ("lse1", lse1.len(), nl),
            ("o2", o2.len(), nq),
            ("lse2", lse2.len(), nl),
        ])?;
        let s = shape.raw(T::DTYPE);
        let (o, l) = (mv(o1), lse1.as_mut_ptr());
        // SAFETY: as forward(); the C call merges in place where o is o1.
        check(unsafe { sys::clattn_merge(self.as_raw(), &s, o, l, cv(o2), lse2.as_ptr(), o, l) })
    }
}

/// The lengths of what the gradient ops read: Q, K, V, O, the LSE pairs
/// and dO.
fn check_grad_inputs<T>(
    shape: &Shape,
    q: &[T],
    k: &[T],
    v: &[T],
    o: &[T],
    lse: &[f32],
    d_out: &[T],
) -> Result<()> {
    let (nq, nkv, nl) = (shape.q_len(), shape.kv_len(), shape.lse_len());
    check_lengths(&[
        ("q", q.len(), nq),
        ("k", k.len(), nkv),
        ("v", v.len(), nkv),
        ("o", o.len(), nq),
        ("lse", lse.len(), nl),
        ("d_out", d_out.len(), nq),
    ])
}

/// clattn_grad_q's and clattn_grad_k's signature.
type GradOne = unsafe extern "C" fn(
    *mut sys::clattn_context,
    *const sys::clattn_shape,
    *const c_void,
    *const c_void,
    *const c_void,
    *const c_void,
    *const f32,
    *const c_void,
    *mut c_void,
) -> sys::clattn_status;

fn cv<T>(s: &[T]) -> *const c_void {
    s.as_ptr() as *const c_void
}

fn mv<T>(s: &mut [T]) -> *mut c_void {
    s.as_mut_ptr() as *mut c_void
}

/// A tensor element: `f32`, [`F16`] or [`Bf16`].
pub trait Element: Copy + private::Sealed {
    const DTYPE: sys::clattn_dtype;
    /// This element's value in float32 (exact).
    fn to_f32(self) -> f32;
    /// The element nearest x (ties to even; NaN stays NaN).
    fn from_f32(x: f32) -> Self;
}

mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::F16 {}
    impl Sealed for super::Bf16 {}
}

impl Element for f32 {
    const DTYPE: sys::clattn_dtype = sys::CLATTN_DTYPE_F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> f32 {
        x
    }
}

/// IEEE binary16, as its bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct F16(pub u16);

/// bfloat16 (the top half of a binary32), as its bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Bf16(pub u16);

fn convert_in(dtype: sys::clattn_dtype, bits: u16) -> f32 {
    let mut out = 0.0f32;
    // SAFETY: one element each way.
    unsafe { sys::clattn_to_f32(dtype, &bits as *const u16 as *const c_void, &mut out, 1) };
    out
}

fn convert_out(dtype: sys::clattn_dtype, x: f32) -> u16 {
    let mut bits = 0u16;
    // SAFETY: one element each way.
    unsafe { sys::clattn_from_f32(dtype, &x, &mut bits as *mut u16 as *mut c_void, 1) };
    bits
}

impl Element for F16 {
    const DTYPE: sys::clattn_dtype = sys::CLATTN_DTYPE_F16;
    fn to_f32(self) -> f32 {
        convert_in(Self::DTYPE, self.0)
    }
    fn from_f32(x: f32) -> F16 {
        F16(convert_out(Self::DTYPE, x))
    }
}

impl Element for Bf16 {
    const DTYPE: sys::clattn_dtype = sys::CLATTN_DTYPE_BF16;
    fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
    fn from_f32(x: f32) -> Bf16 {
        Bf16(convert_out(Self::DTYPE, x))
    }
}

/// Converts float32 values to elements of T, as clattn rounds them.
pub fn convert_from_f32<T: Element>(x: &[f32]) -> Vec<T> {
    x.iter().map(|&v| T::from_f32(v)).collect()
}

/// Converts elements of T to float32, exactly.
pub fn convert_to_f32<T: Element>(x: &[T]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

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
/// sinks) owned here. The dtype comes from the slices each call takes.
#[derive(Clone, Debug)]
pub struct Shape {
    raw: sys::clattn_shape,
    cu_q: Vec<u32>,
    cu_kv: Vec<u32>,
    slopes: Vec<f32>,
    sinks: Vec<f32>,
}

// SAFETY: the stored struct's pointers are always NULL: raw() points a copy
// at the vectors this shape owns, which only &self reads.
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
        ShapeBuilder {
            shape: Shape {
                raw,
                cu_q: Vec::new(),
                cu_kv: Vec::new(),
                slopes: Vec::new(),
                sinks: Vec::new(),
            },
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
        Ok(Shape {
            raw,
            cu_q: Vec::new(),
            cu_kv: Vec::new(),
            slopes: Vec::new(),
            sinks: Vec::new(),
        })
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
        s
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

    /// The shape, checked as the library checks it (`clattn_shape_validate`).
    pub fn build(self) -> Result<Shape> {
        let mut shape = self.shape;
        let heads = shape.raw.num_heads as usize;
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

/// One device as `clattn_list_devices` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub backend: Backend,
    /// OpenCL platform and device index ("P:D"); None for native.
    pub index: Option<(u32, u32)>,
    pub platform: String,
    pub name: String,
}

/// Every OpenCL device, then the native backend.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let mut count = 0usize;
    // SAFETY: capacity 0 with NULL asks for the count.
    check(unsafe { sys::clattn_list_devices(ptr::null_mut(), 0, &mut count) })?;
    // SAFETY: zeroed C data.
    let mut raw: Vec<sys::clattn_device_info> = vec![unsafe { std::mem::zeroed() }; count];
    let mut got = 0usize;
    // SAFETY: raw holds count entries.
    check(unsafe { sys::clattn_list_devices(raw.as_mut_ptr(), count, &mut got) })?;
    raw.truncate(got.min(count));
    Ok(raw
        .iter()
        .map(|d| DeviceInfo {
            backend: Backend::from_raw(d.backend),
            index: if d.platform_index < 0 {
                None
            } else {
                Some((d.platform_index as u32, d.device_index as u32))
            },
            // SAFETY: NUL-terminated within their 128 bytes.
            platform: unsafe { text(d.platform.as_ptr()) },
            name: unsafe { text(d.name.as_ptr()) },
        })
        .collect())
}

/// The kernel variants a backend offers, its default first.
pub fn variants(backend: Backend) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0.. {
        // SAFETY: a static string or NULL past the last.
        let p = unsafe { sys::clattn_variant_name(backend.raw(), i) };
        if p.is_null() {
            break;
        }
        out.push(unsafe { text(p) });
    }
    out
}
