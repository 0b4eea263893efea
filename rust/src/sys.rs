//! Raw bindings to `include/clattn.h` (and, with the `opencl` feature,
//! `include/clattn_cl.h`), written by hand. Every struct is `#[repr(C)]` and
//! laid out as the header's; `tests/layout.rs` checks each size and field
//! offset against the C compiler's.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

pub type clattn_status = c_int;
pub const CLATTN_OK: clattn_status = 0;
pub const CLATTN_ERROR_NULL_POINTER: clattn_status = 1;
pub const CLATTN_ERROR_ZERO_SIZE: clattn_status = 2;
pub const CLATTN_ERROR_HEADS_NOT_DIVISIBLE: clattn_status = 3;
pub const CLATTN_ERROR_HEAD_DIM_TOO_LARGE: clattn_status = 4;
pub const CLATTN_ERROR_INVALID_SCALE: clattn_status = 6;
pub const CLATTN_ERROR_SIZE_OVERFLOW: clattn_status = 7;
pub const CLATTN_ERROR_TOO_LARGE_FOR_DEVICE: clattn_status = 8;
pub const CLATTN_ERROR_INVALID_OPTION: clattn_status = 9;
pub const CLATTN_ERROR_UNKNOWN_VARIANT: clattn_status = 10;
pub const CLATTN_ERROR_DEVICE_NOT_FOUND: clattn_status = 11;
pub const CLATTN_ERROR_NO_PLATFORM: clattn_status = 12;
pub const CLATTN_ERROR_BUILD_FAILED: clattn_status = 13;
pub const CLATTN_ERROR_WORK_GROUP_TOO_LARGE: clattn_status = 14;
pub const CLATTN_ERROR_OPENCL: clattn_status = 15;
pub const CLATTN_ERROR_OUT_OF_MEMORY: clattn_status = 16;
pub const CLATTN_ERROR_WRONG_BACKEND: clattn_status = 17;
pub const CLATTN_ERROR_INVALID_BUFFER: clattn_status = 18;
pub const CLATTN_ERROR_UNSUPPORTED_SHAPE: clattn_status = 19;
pub const CLATTN_ERROR_INVALID_DTYPE: clattn_status = 20;
pub const CLATTN_ERROR_INVALID_SEQLENS: clattn_status = 21;
pub const CLATTN_ERROR_INVALID_MODIFIER: clattn_status = 22;
pub const CLATTN_ERROR_IO: clattn_status = 23;

pub const CLATTN_MAX_HEAD_DIM: u32 = 256;

pub type clattn_backend = c_int;
pub const CLATTN_BACKEND_AUTO: clattn_backend = 0;
pub const CLATTN_BACKEND_OPENCL_GPU: clattn_backend = 1;
pub const CLATTN_BACKEND_OPENCL_CPU: clattn_backend = 2;
pub const CLATTN_BACKEND_NATIVE: clattn_backend = 3;

pub type clattn_dtype = c_int;
pub const CLATTN_DTYPE_F32: clattn_dtype = 0;
pub const CLATTN_DTYPE_F16: clattn_dtype = 1;
pub const CLATTN_DTYPE_BF16: clattn_dtype = 2;

pub const CLATTN_CAUSAL_TOP_LEFT: c_int = 1;
pub const CLATTN_CAUSAL_BOTTOM_RIGHT: c_int = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clattn_options {
    pub backend: clattn_backend,
    pub device: *const c_char,
    pub variant: *const c_char,
    pub num_threads: c_int,
}

/// Opaque: only ever behind a pointer.
#[repr(C)]
pub struct clattn_context {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct clattn_shape {
    pub batch: u32,
    pub q_seq: u32,
    pub kv_seq: u32,
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub causal: c_int,
    pub window: u32,
    pub window_right: u32,
    pub scale: f32,
    pub dtype: clattn_dtype,
    pub q_offset: u32,
    pub kv_offset: u32,
    pub accumulate: c_int,
    pub cu_seqlens_q: *const u32,
    pub cu_seqlens_kv: *const u32,
    pub softcap: f32,
    pub alibi_slopes: *const f32,
    pub dropout_p: f32,
    pub dropout_seed: u64,
    pub dropout_offset: u64,
    pub sinks: *const f32,
    pub score_fn: *const c_char,
    pub mask_fn: *const c_char,
    pub score_params: *const f32,
    pub score_params_count: u32,
    pub score_native: Option<ScoreFn>,
    pub score_ds_native: Option<ScoreFn>,
    pub mask_native: Option<MaskFn>,
    pub bias: *const c_void,
    pub bool_mask: *const u8,
    pub bias_batch: u32,
    pub bias_heads: u32,
    pub bias_cl: *mut c_void,
    pub bool_mask_cl: *mut c_void,
    pub score_span_native: Option<SpanFn>,
    pub bias_dtype: clattn_dtype,
    pub score_dp_native: Option<ParamsFn>,
}

/// A score function or its derivative in C's form (`clattn_shape`'s
/// `score_native`).
pub type ScoreFn = unsafe extern "C" fn(f32, u32, u32, u32, u32, *const f32) -> f32;
/// A score function over a span of pairs in C's form (`clattn_shape`'s
/// `score_span_native`).
pub type SpanFn =
    unsafe extern "C" fn(*mut f32, *mut f32, u32, u32, u32, u32, u32, u32, *const f32);
/// A score function's derivative in its parameters in C's form (`clattn_shape`'s
/// `score_dp_native`): the indices into them and the partials, and how many.
pub type ParamsFn =
    unsafe extern "C" fn(f32, u32, u32, u32, u32, *const f32, *mut u32, *mut f32) -> u32;
/// A mask function in C's form (`clattn_shape`'s `mask_native`).
pub type MaskFn = unsafe extern "C" fn(u32, u32, u32, u32) -> c_int;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct clattn_device_info {
    pub backend: clattn_backend,
    pub platform_index: c_int,
    pub device_index: c_int,
    pub platform: [c_char; 128],
    pub name: [c_char; 128],
}

extern "C" {
    pub fn clattn_status_string(status: clattn_status) -> *const c_char;
    pub fn clattn_last_error() -> *const c_char;
    pub fn clattn_version() -> *const c_char;
    pub fn clattn_backend_name(backend: clattn_backend) -> *const c_char;
    pub fn clattn_options_default() -> clattn_options;
    pub fn clattn_context_create(
        opts: *const clattn_options,
        ctx: *mut *mut clattn_context,
    ) -> clattn_status;
    pub fn clattn_context_destroy(ctx: *mut clattn_context);
    pub fn clattn_context_backend(ctx: *const clattn_context) -> clattn_backend;
    pub fn clattn_context_device(ctx: *const clattn_context) -> *const c_char;
    pub fn clattn_context_variant(ctx: *const clattn_context) -> *const c_char;
    pub fn clattn_context_kernels(ctx: *const clattn_context) -> *const c_char;
    pub fn clattn_context_build_options(ctx: *const clattn_context) -> *const c_char;
    pub fn clattn_context_log(ctx: *const clattn_context) -> *const c_char;
    pub fn clattn_to_f32(dtype: clattn_dtype, src: *const c_void, dst: *mut f32, n: usize);
    pub fn clattn_from_f32(dtype: clattn_dtype, src: *const f32, dst: *mut c_void, n: usize);
    pub fn clattn_shape_default() -> clattn_shape;
    pub fn clattn_shape_validate(shape: *const clattn_shape) -> clattn_status;
    pub fn clattn_shape_visible_pairs(shape: *const clattn_shape) -> u64;
    pub fn clattn_shape_from_seed(params: *const u32, shape: *mut clattn_shape) -> clattn_status;
    pub fn clattn_grad_v(
        ctx: *mut clattn_context,
        shape: *const clattn_shape,
        d_out: *const c_void,
        q: *const c_void,
        k: *const c_void,
        lse: *const f32,
        dv: *mut c_void,
    ) -> clattn_status;
    pub fn clattn_forward(
        ctx: *mut clattn_context,
        shape: *const clattn_shape,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *mut c_void,
        lse: *mut f32,
    ) -> clattn_status;
    pub fn clattn_backward(
        ctx: *mut clattn_context,
        shape: *const clattn_shape,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *const c_void,
        lse: *const f32,
        d_out: *const c_void,
        dq: *mut c_void,
        dk: *mut c_void,
        dv: *mut c_void,
    ) -> clattn_status;
    pub fn clattn_merge(
        ctx: *mut clattn_context,
        shape: *const clattn_shape,
        o1: *const c_void,
        lse1: *const f32,
        o2: *const c_void,
        lse2: *const f32,
        o: *mut c_void,
        lse: *mut f32,
    ) -> clattn_status;
    pub fn clattn_grad_sinks(
        ctx: *mut clattn_context,
        shape: *const clattn_shape,
        o: *const c_void,
        lse: *const f32,
        d_out: *const c_void,
        d_sinks: *mut f32,
    ) -> clattn_status;
    pub fn clattn_grad_bias(
        ctx: *mut clattn_context,
        shape: *const clattn_shape,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *const c_void,
        lse: *const f32,
        d_out: *const c_void,
        d_bias: *mut f32,
    ) -> clattn_status;
    pub fn clattn_grad_score_params(
        ctx: *mut clattn_context,
        shape: *const clattn_shape,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *const c_void,
        lse: *const f32,
        d_out: *const c_void,
        d_params: *mut f32,
    ) -> clattn_status;
    pub fn clattn_grad_q(
        ctx: *mut clattn_context,
        shape: *const clattn_shape,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *const c_void,
        lse: *const f32,
        d_out: *const c_void,
        dq: *mut c_void,
    ) -> clattn_status;
    pub fn clattn_grad_k(
        ctx: *mut clattn_context,
        shape: *const clattn_shape,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *const c_void,
        lse: *const f32,
        d_out: *const c_void,
        dk: *mut c_void,
    ) -> clattn_status;
    pub fn clattn_dropout_mask(
        shape: *const clattn_shape,
        b: u32,
        head: u32,
        keep: *mut u8,
    ) -> clattn_status;
    pub fn clattn_variant_name(backend: clattn_backend, index: usize) -> *const c_char;
    pub fn clattn_native_wrapper(part: c_int) -> *const c_char;
    pub fn clattn_list_devices(
        devices: *mut clattn_device_info,
        capacity: usize,
        count: *mut usize,
    ) -> clattn_status;
}

/// The OpenCL calls of `clattn_cl.h`, on raw handles (`cl_context`,
/// `cl_device_id`, `cl_command_queue`, `cl_mem`, `cl_event` are pointers).
#[cfg(feature = "opencl")]
pub mod cl {
    use super::{clattn_context, clattn_options, clattn_shape, clattn_status};
    use std::os::raw::c_void;

    pub type cl_context = *mut c_void;
    pub type cl_device_id = *mut c_void;
    pub type cl_command_queue = *mut c_void;
    pub type cl_mem = *mut c_void;
    pub type cl_event = *mut c_void;
    pub type cl_uint = u32;

    /// A tensor inside a `cl_mem`: `offset` counts elements, not bytes.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct clattn_cl_tensor {
        pub buffer: cl_mem,
        pub offset: usize,
    }

    extern "C" {
        pub fn clattn_context_create_from_cl(
            opts: *const clattn_options,
            context: cl_context,
            device: cl_device_id,
            queue: cl_command_queue,
            ctx: *mut *mut clattn_context,
        ) -> clattn_status;
        pub fn clattn_context_cl_context(ctx: *const clattn_context) -> cl_context;
        pub fn clattn_context_cl_queue(ctx: *const clattn_context) -> cl_command_queue;
        pub fn clattn_forward_cl(
            ctx: *mut clattn_context,
            shape: *const clattn_shape,
            q: clattn_cl_tensor,
            k: clattn_cl_tensor,
            v: clattn_cl_tensor,
            o: clattn_cl_tensor,
            lse: clattn_cl_tensor,
            num_events_in_wait_list: cl_uint,
            event_wait_list: *const cl_event,
            event: *mut cl_event,
        ) -> clattn_status;
        pub fn clattn_backward_cl(
            ctx: *mut clattn_context,
            shape: *const clattn_shape,
            q: clattn_cl_tensor,
            k: clattn_cl_tensor,
            v: clattn_cl_tensor,
            o: clattn_cl_tensor,
            lse: clattn_cl_tensor,
            d_out: clattn_cl_tensor,
            dq: clattn_cl_tensor,
            dk: clattn_cl_tensor,
            dv: clattn_cl_tensor,
            num_events_in_wait_list: cl_uint,
            event_wait_list: *const cl_event,
            event: *mut cl_event,
        ) -> clattn_status;
        pub fn clattn_grad_sinks_cl(
            ctx: *mut clattn_context,
            shape: *const clattn_shape,
            o: clattn_cl_tensor,
            lse: clattn_cl_tensor,
            d_out: clattn_cl_tensor,
            d_sinks: *mut f32,
            num_events_in_wait_list: cl_uint,
            event_wait_list: *const cl_event,
        ) -> clattn_status;
        pub fn clattn_grad_bias_cl(
            ctx: *mut clattn_context,
            shape: *const clattn_shape,
            q: clattn_cl_tensor,
            k: clattn_cl_tensor,
            v: clattn_cl_tensor,
            o: clattn_cl_tensor,
            lse: clattn_cl_tensor,
            d_out: clattn_cl_tensor,
            d_bias: *mut f32,
            num_events_in_wait_list: cl_uint,
            event_wait_list: *const cl_event,
        ) -> clattn_status;
        pub fn clattn_grad_score_params_cl(
            ctx: *mut clattn_context,
            shape: *const clattn_shape,
            q: clattn_cl_tensor,
            k: clattn_cl_tensor,
            v: clattn_cl_tensor,
            o: clattn_cl_tensor,
            lse: clattn_cl_tensor,
            d_out: clattn_cl_tensor,
            d_params: *mut f32,
            num_events_in_wait_list: cl_uint,
            event_wait_list: *const cl_event,
        ) -> clattn_status;
        pub fn clattn_grad_v_cl(
            ctx: *mut clattn_context,
            shape: *const clattn_shape,
            d_out: clattn_cl_tensor,
            q: clattn_cl_tensor,
            k: clattn_cl_tensor,
            lse: clattn_cl_tensor,
            dv: clattn_cl_tensor,
            num_events_in_wait_list: cl_uint,
            event_wait_list: *const cl_event,
            event: *mut cl_event,
        ) -> clattn_status;
        pub fn clattn_merge_cl(
            ctx: *mut clattn_context,
            shape: *const clattn_shape,
            o1: clattn_cl_tensor,
            lse1: clattn_cl_tensor,
            o2: clattn_cl_tensor,
            lse2: clattn_cl_tensor,
            o: clattn_cl_tensor,
            lse: clattn_cl_tensor,
            num_events_in_wait_list: cl_uint,
            event_wait_list: *const cl_event,
            event: *mut cl_event,
        ) -> clattn_status;
    }
}
