//! The caller's functions and tensors (docs/programmable.md) from Rust, on
//! each backend: a bias tensor against a score function that adds the same
//! table through its parameters (O, and dBias against the parameters'
//! gradient), a bool mask against a mask function; arrays of the wrong
//! length and sources with a NUL byte are errors before any call.
mod common;

use std::os::raw::c_int;

use clattn::{sys, Context, ScoreFns, Shape};
use common::{contexts, random};

const SQ: usize = 13;
const SK: usize = 17;
const H: usize = 2;
const D: usize = 8;

/// Entry (h, q, k) of a [1][H][SQ][SK] table (no offsets: positions are rows).
fn at(h: u32, q: u32, k: u32) -> usize {
    (h as usize * SQ + q as usize) * SK + k as usize
}

extern "C" fn table_score(s: f32, _b: u32, h: u32, q: u32, k: u32, p: *const f32) -> f32 {
    // SAFETY: p holds H * SQ * SK floats and (h, q, k) lies within them.
    s + unsafe { *p.add(at(h, q, k)) }
}

extern "C" fn table_ds(_s: f32, _b: u32, _h: u32, _q: u32, _k: u32, _p: *const f32) -> f32 {
    1.0
}

extern "C" fn table_dp(
    _s: f32,
    _b: u32,
    h: u32,
    q: u32,
    k: u32,
    _p: *const f32,
    index: *mut u32,
    d: *mut f32,
) -> u32 {
    // SAFETY: the library passes room for CLATTN_SCORE_DP_MAX entries.
    unsafe {
        *index = at(h, q, k) as u32;
        *d = 1.0;
    }
    1
}

extern "C" fn quads(_b: u32, _h: u32, q: u32, k: u32) -> c_int {
    (q / 4 == k / 4 || k == 0) as c_int
}

fn table_cl() -> String {
    format!(
        "float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p)\n\
         {{ return s + p[(h * {SQ}u + q) * {SK}u + k]; }}\n\
         float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float *p)\n\
         {{ return 1.0f; }}\n"
    )
}

const QUADS_CL: &str =
    "bool clattn_mask(uint b, uint h, uint q, uint k) { return q / 4u == k / 4u || k == 0u; }";

fn base() -> clattn::ShapeBuilder {
    Shape::builder(1, SQ as u32, SK as u32, H as u32, 1, D as u32)
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    let big = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * big)
}

struct Run {
    o: Vec<f32>,
    lse: Vec<f32>,
}

fn forward(ctx: &Context, s: &Shape, q: &[f32], k: &[f32], v: &[f32]) -> Run {
    let mut run = Run { o: vec![f32::NAN; s.q_len()], lse: vec![f32::NAN; s.lse_len()] };
    ctx.forward(s, q, k, v, &mut run.o, &mut run.lse).unwrap();
    run
}

#[test]
fn functions_match_tensors() {
    let table: Vec<f32> = random(H * SQ * SK, 7);
    let (q, k, v, d_out) =
        (random(SQ * H * D, 1), random(SK * D, 2), random(SK * D, 3), random(SQ * H * D, 4));
    let fns = ScoreFns { score: table_score, score_ds: table_ds, score_dp: Some(table_dp) };
    let by_fn = base().score_fn(&table_cl(), Some(fns), &table).build().unwrap();
    let by_bias = base().bias(&table, 1, H as u32).build().unwrap();
    let keep: Vec<u8> =
        (0..SQ * SK).map(|e| quads(0, 0, (e / SK) as u32, (e % SK) as u32) as u8).collect();
    let by_mask = base().mask_fn(QUADS_CL, Some(quads)).build().unwrap();
    let by_keep = base().bool_mask(&keep, 1, 1).build().unwrap();
    for (name, ctx) in contexts() {
        let (f, b) = (forward(&ctx, &by_fn, &q, &k, &v), forward(&ctx, &by_bias, &q, &k, &v));
        assert!(close(&f.o, &b.o, 1e-5), "{name}: O of the table's function and bias differ");
        // the table's gradient both ways, from the same forward
        let mut d_bias = vec![f32::NAN; by_bias.bias_len()];
        let mut d_params = vec![f32::NAN; by_fn.score_params_len()];
        ctx.grad_bias(&by_bias, &q, &k, &v, &b.o, &b.lse, &d_out, &mut d_bias).unwrap();
        ctx.grad_score_params(&by_fn, &q, &k, &v, &b.o, &b.lse, &d_out, &mut d_params).unwrap();
        assert!(d_bias.iter().any(|&x| x != 0.0), "{name}: dBias is all zero");
        assert!(close(&d_params, &d_bias, 1e-6), "{name}: the parameters' gradient is not dBias");
        let (m, kp) = (forward(&ctx, &by_mask, &q, &k, &v), forward(&ctx, &by_keep, &q, &k, &v));
        assert!(close(&m.o, &kp.o, 1e-6), "{name}: O of the mask function and bool mask differ");
        let plain = forward(&ctx, &base().build().unwrap(), &q, &k, &v);
        assert!(!close(&m.o, &plain.o, 1e-3), "{name}: the mask changed nothing");
    }
}

#[test]
fn bad_arrays_are_errors() {
    let table = vec![0.5f32; H * SQ * SK];
    let err = base().bias(&table[1..], 1, H as u32).build().unwrap_err();
    assert_eq!(err.status(), sys::CLATTN_ERROR_INVALID_BUFFER, "{err}");
    let err = base().bool_mask(&[1u8; SK], 1, 1).build().unwrap_err();
    assert_eq!(err.status(), sys::CLATTN_ERROR_INVALID_BUFFER, "{err}");
    let err = base().mask_fn("bool clattn_mask\0", None).build().unwrap_err();
    assert_eq!(err.status(), sys::CLATTN_ERROR_INVALID_MODIFIER, "{err}");
    // the parameters' gradient: its length, and the derivative it needs
    let fns = ScoreFns { score: table_score, score_ds: table_ds, score_dp: None };
    let s = base().score_fn(&table_cl(), Some(fns), &table).build().unwrap();
    let (q, kv) = (vec![0.1f32; s.q_len()], vec![0.2f32; s.kv_len()]);
    let lse = vec![0.0f32; s.lse_len()];
    for (name, ctx) in contexts() {
        let mut short = vec![f32::NAN; table.len() - 1];
        let err = ctx.grad_score_params(&s, &q, &kv, &kv, &q, &lse, &q, &mut short).unwrap_err();
        assert_eq!(err.status(), sys::CLATTN_ERROR_INVALID_BUFFER, "{name}: {err}");
        let mut d = vec![f32::NAN; table.len()];
        let err = ctx.grad_score_params(&s, &q, &kv, &kv, &q, &lse, &q, &mut d).unwrap_err();
        assert_eq!(err.status(), sys::CLATTN_ERROR_NULL_POINTER, "{name}: {err}");
        assert!(d.iter().all(|x| x.is_nan()), "{name}: a refused call wrote");
    }
}
