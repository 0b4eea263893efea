//! The `opencl` feature's raw bindings on the caller's buffers: a forward
//! and a backward enqueued on cl_mem give the bytes the slice calls give,
//! and a second clattn context made over the first one's cl_context and
//! queue (clattn_context_create_from_cl) computes the same. Runs on the
//! OpenCL CPU device ("cpu"), which must be present.
#![cfg(feature = "opencl")]

mod common;

use std::os::raw::c_void;
use std::ptr;

use clattn::sys::{self, cl};
use clattn::{Causal, Context, Shape};
use common::random;

// The few OpenCL 1.2 entry points the test needs, from libOpenCL (linked by
// the crate).
extern "C" {
    fn clCreateBuffer(
        context: cl::cl_context,
        flags: u64,
        size: usize,
        host_ptr: *mut c_void,
        errcode_ret: *mut i32,
    ) -> cl::cl_mem;
    fn clEnqueueReadBuffer(
        queue: cl::cl_command_queue,
        buffer: cl::cl_mem,
        blocking: u32,
        offset: usize,
        size: usize,
        ptr: *mut c_void,
        num_events: u32,
        wait_list: *const cl::cl_event,
        event: *mut cl::cl_event,
    ) -> i32;
    fn clReleaseMemObject(buffer: cl::cl_mem) -> i32;
    fn clReleaseEvent(event: cl::cl_event) -> i32;
    fn clWaitForEvents(num_events: u32, events: *const cl::cl_event) -> i32;
}

const CL_MEM_READ_WRITE: u64 = 1 << 0;
const CL_MEM_COPY_HOST_PTR: u64 = 1 << 5;

/// A device buffer holding `data` after `pad` leading floats.
struct Buffer(cl::cl_mem);

impl Buffer {
    fn new(ctx: cl::cl_context, data: &[f32], pad: usize) -> Buffer {
        let mut host = vec![f32::NAN; pad];
        host.extend_from_slice(data);
        let mut err = 0;
        let mem = unsafe {
            clCreateBuffer(
                ctx,
                CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                host.len() * 4,
                host.as_mut_ptr() as *mut c_void,
                &mut err,
            )
        };
        assert!(err == 0 && !mem.is_null(), "clCreateBuffer: {err}");
        Buffer(mem)
    }

    fn tensor(&self, pad: usize) -> cl::clattn_cl_tensor {
        cl::clattn_cl_tensor { buffer: self.0, offset: pad }
    }

    fn read(&self, queue: cl::cl_command_queue, n: usize, pad: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; n];
        let err = unsafe {
            clEnqueueReadBuffer(
                queue,
                self.0,
                1,
                pad * 4,
                n * 4,
                out.as_mut_ptr() as *mut c_void,
                0,
                ptr::null(),
                ptr::null_mut(),
            )
        };
        assert_eq!(err, 0, "clEnqueueReadBuffer");
        out
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        unsafe { clReleaseMemObject(self.0) };
    }
}

#[test]
fn cl_mem_calls_give_the_slice_calls_bytes() {
    let ctx = Context::on("cpu").expect("the OpenCL CPU device (PoCL)");
    let shape = Shape::builder(2, 23, 31, 4, 2, 16).causal(Causal::BottomRight).build().unwrap();
    let (nq, nkv, nl) = (shape.q_len(), shape.kv_len(), shape.lse_len());
    let (q, k, v, d_out) = (random(nq, 1), random(nkv, 2), random(nkv, 3), random(nq, 4));
    let (mut o, mut lse) = (vec![0.0f32; nq], vec![0.0f32; nl]);
    ctx.forward(&shape, &q, &k, &v, &mut o, &mut lse).unwrap();
    let (mut dq, mut dk, mut dv) = (vec![0.0f32; nq], vec![0.0f32; nkv], vec![0.0f32; nkv]);
    ctx.backward(&shape, &q, &k, &v, &o, &lse, &d_out, &mut dq, &mut dk, &mut dv).unwrap();

    let raw = ctx.as_raw();
    let (cctx, queue) =
        unsafe { (cl::clattn_context_cl_context(raw), cl::clattn_context_cl_queue(raw)) };
    assert!(!cctx.is_null() && !queue.is_null());
    // A second clattn context on the first one's OpenCL objects.
    let mut other = ptr::null_mut();
    let opts = unsafe { sys::clattn_options_default() };
    let st = unsafe {
        cl::clattn_context_create_from_cl(&opts, cctx, get_device(&ctx), queue, &mut other)
    };
    assert_eq!(st, sys::CLATTN_OK);
    let pad = 3;
    let bufs: Vec<Buffer> = [&q, &k, &v, &d_out, &vec![f32::NAN; nq], &vec![f32::NAN; nl]]
        .iter()
        .chain([&vec![f32::NAN; nq], &vec![f32::NAN; nkv], &vec![f32::NAN; nkv]].iter())
        .map(|d| Buffer::new(cctx, d, pad))
        .collect();
    let t: Vec<cl::clattn_cl_tensor> = bufs.iter().map(|b| b.tensor(pad)).collect();
    let s = shape.raw(sys::CLATTN_DTYPE_F32);
    let (mut fwd, mut bwd): (cl::cl_event, cl::cl_event) = (ptr::null_mut(), ptr::null_mut());
    unsafe {
        let st = cl::clattn_forward_cl(
            other,
            &s,
            t[0],
            t[1],
            t[2],
            t[4],
            t[5],
            0,
            ptr::null(),
            &mut fwd,
        );
        assert_eq!(st, sys::CLATTN_OK);
        let st = cl::clattn_backward_cl(
            other, &s, t[0], t[1], t[2], t[4], t[5], t[3], t[6], t[7], t[8], 1, &fwd, &mut bwd,
        );
        assert_eq!(st, sys::CLATTN_OK);
        assert_eq!(clWaitForEvents(1, &bwd), 0);
        clReleaseEvent(fwd);
        clReleaseEvent(bwd);
    }
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(same(&bufs[4].read(queue, nq, pad), &o), "O");
    assert!(same(&bufs[5].read(queue, nl, pad), &lse), "LSE");
    assert!(same(&bufs[6].read(queue, nq, pad), &dq), "dQ");
    assert!(same(&bufs[7].read(queue, nkv, pad), &dk), "dK");
    assert!(same(&bufs[8].read(queue, nkv, pad), &dv), "dV");
    // A tensor past its buffer's end is refused, naming it.
    let past = cl::clattn_cl_tensor { buffer: bufs[0].0, offset: pad + 1 };
    let st = unsafe {
        cl::clattn_forward_cl(
            other,
            &s,
            past,
            t[1],
            t[2],
            t[4],
            t[5],
            0,
            ptr::null(),
            ptr::null_mut(),
        )
    };
    assert_eq!(st, sys::CLATTN_ERROR_INVALID_BUFFER);
    drop(bufs);
    unsafe { sys::clattn_context_destroy(other) };
}

/// The device of ctx's queue.
fn get_device(ctx: &Context) -> cl::cl_device_id {
    extern "C" {
        fn clGetCommandQueueInfo(
            queue: cl::cl_command_queue,
            name: u32,
            size: usize,
            value: *mut c_void,
            size_ret: *mut usize,
        ) -> i32;
    }
    const CL_QUEUE_DEVICE: u32 = 0x1091;
    let mut device: cl::cl_device_id = ptr::null_mut();
    let err = unsafe {
        clGetCommandQueueInfo(
            cl::clattn_context_cl_queue(ctx.as_raw()),
            CL_QUEUE_DEVICE,
            std::mem::size_of::<cl::cl_device_id>(),
            &mut device as *mut cl::cl_device_id as *mut c_void,
            ptr::null_mut(),
        )
    };
    assert_eq!(err, 0);
    device
}
