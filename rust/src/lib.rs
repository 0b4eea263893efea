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

mod devices;
mod element;
mod shape;
pub mod sys;

pub use devices::{devices, variants, DeviceInfo};
pub use element::{convert_from_f32, convert_to_f32, Bf16, Element, F16};
pub use shape::{Causal, ScoreFns, Shape, ShapeBuilder};

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

    /// The bias's gradient ([`ShapeBuilder::bias`]'s layout, float32) from
    /// the call's tensors (`clattn_grad_bias`).
    #[allow(clippy::too_many_arguments)]
    pub fn grad_bias<T: Element>(
        &self,
        shape: &Shape,
        q: &[T],
        k: &[T],
        v: &[T],
        o: &[T],
        lse: &[f32],
        d_out: &[T],
        d_bias: &mut [f32],
    ) -> Result<()> {
        self.grad_over_pairs(
            shape,
            q,
            k,
            v,
            o,
            lse,
            d_out,
            d_bias,
            shape.bias_len(),
            sys::clattn_grad_bias,
        )
    }

    /// The score function's parameters' gradient (one float32 each) from
    /// the call's tensors (`clattn_grad_score_params`: on a GPU's device
    /// from the score function's `clattn_score_dp`, else on the host through
    /// [`ScoreFns`]'s `score_dp`).
    #[allow(clippy::too_many_arguments)]
    pub fn grad_score_params<T: Element>(
        &self,
        shape: &Shape,
        q: &[T],
        k: &[T],
        v: &[T],
        o: &[T],
        lse: &[f32],
        d_out: &[T],
        d_params: &mut [f32],
    ) -> Result<()> {
        self.grad_over_pairs(
            shape,
            q,
            k,
            v,
            o,
            lse,
            d_out,
            d_params,
            shape.score_params_len(),
            sys::clattn_grad_score_params,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn grad_over_pairs<T: Element>(
        &self,
        shape: &Shape,
        q: &[T],
        k: &[T],
        v: &[T],
        o: &[T],
        lse: &[f32],
        d_out: &[T],
        out: &mut [f32],
        out_len: usize,
        call: GradPairs,
    ) -> Result<()> {
        check_grad_inputs(shape, q, k, v, o, lse, d_out)?;
        check_lengths(&[("the gradient", out.len(), out_len)])?;
        let s = shape.raw(T::DTYPE);
        // SAFETY: as forward(); out holds the gradient's elements.
        check(unsafe {
            call(
                self.as_raw(),
                &s,
                cv(q),
                cv(k),
                cv(v),
                cv(o),
                lse.as_ptr(),
                cv(d_out),
                out.as_mut_ptr(),
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

/// clattn_grad_bias's and clattn_grad_score_params's signature.
type GradPairs = unsafe extern "C" fn(
    *mut sys::clattn_context,
    *const sys::clattn_shape,
    *const c_void,
    *const c_void,
    *const c_void,
    *const c_void,
    *const f32,
    *const c_void,
    *mut f32,
) -> sys::clattn_status;

fn cv<T>(s: &[T]) -> *const c_void {
    s.as_ptr() as *const c_void
}

fn mv<T>(s: &mut [T]) -> *mut c_void {
    s.as_mut_ptr() as *mut c_void
}
