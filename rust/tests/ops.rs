//! Every op on each backend against the float64 reference.
mod common;

use clattn::{convert_from_f32, convert_to_f32, Bf16, Causal, Context, Element, Shape, F16};
use common::{contexts, random, rel_err, Problem};

const TOL_F32: f64 = 2e-5;

fn cases() -> Vec<(&'static str, Problem)> {
    let mut out = Vec::new();
    let mut p = Problem::new(2, 19, 27, 4, 2, 16);
    p.causal = Causal::TopLeft;
    out.push(("gqa causal top-left", p));
    let mut p = Problem::new(1, 30, 17, 2, 1, 32);
    p.causal = Causal::BottomRight; // the first 13 rows see no key
    p.sinks = Some(vec![1.5, -0.5]);
    out.push(("bottom-right with sinks", p));
    let mut p = Problem::new(1, 21, 40, 4, 4, 24);
    p.causal = Causal::TopLeft;
    p.window = 9;
    p.right = 3;
    p.q_offset = 20;
    p.kv_offset = 7;
    p.softcap = 2.5;
    p.slopes = Some(vec![0.5, 0.25, 0.125, 0.0625]);
    p.scale = Some(0.3);
    out.push(("two-sided window, offsets, softcap, ALiBi", p));
    out
}

/// Every op of one problem on ctx in element type T, against the reference
/// within tol.
fn check_ops<T: Element>(ctx: &Context, name: &str, p: &Problem, shape: &Shape, tol: f64) {
    let r = |v: Vec<f32>| -> Vec<f32> { convert_to_f32(&convert_from_f32::<T>(&v)) };
    let (q, k, v, d_out) =
        (r(random(p.nq(), 1)), r(random(p.nkv(), 2)), r(random(p.nkv(), 3)), r(random(p.nq(), 4)));
    let (tq, tk, tv, tdo) = (
        convert_from_f32::<T>(&q),
        convert_from_f32::<T>(&k),
        convert_from_f32::<T>(&v),
        convert_from_f32::<T>(&d_out),
    );
    let (o_ref, lse_ref) = p.forward(&q, &k, &v);
    let mut o = vec![T::from_f32(f32::NAN); p.nq()];
    let mut lse = vec![f32::NAN; shape.lse_len()];
    ctx.forward(shape, &tq, &tk, &tv, &mut o, &mut lse).unwrap();
    let o32 = convert_to_f32(&o);
    assert!(rel_err(&o32, &o_ref) < tol, "{name}: forward O off by {}", rel_err(&o32, &o_ref));
    for (row, &want) in lse_ref.iter().enumerate() {
        let (m, l) = (lse[2 * row], lse[2 * row + 1]);
        if want == f64::NEG_INFINITY {
            assert!(m == -1e30 && l == -1e30, "{name}: row {row} sees nothing but has ({m}, {l})");
        } else {
            assert!(
                ((m + l) as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                "{name}: LSE row {row}"
            );
        }
    }
    let (dq_ref, dk_ref, dv_ref, ds_ref) = p.backward(&q, &k, &v, &d_out);
    let z = T::from_f32(f32::NAN);
    let (mut dq, mut dk, mut dv) = (vec![z; p.nq()], vec![z; p.nkv()], vec![z; p.nkv()]);
    ctx.backward(shape, &tq, &tk, &tv, &o, &lse, &tdo, &mut dq, &mut dk, &mut dv).unwrap();
    for (what, got, want) in [("dq", &dq, &dq_ref), ("dk", &dk, &dk_ref), ("dv", &dv, &dv_ref)] {
        let e = rel_err(&convert_to_f32(got), want);
        assert!(e < tol, "{name}: backward {what} off by {e}");
    }
    let mut one = vec![z; p.nq()];
    ctx.grad_q(shape, &tq, &tk, &tv, &o, &lse, &tdo, &mut one).unwrap();
    assert!(rel_err(&convert_to_f32(&one), &dq_ref) < tol, "{name}: grad_q");
    let mut one = vec![z; p.nkv()];
    ctx.grad_k(shape, &tq, &tk, &tv, &o, &lse, &tdo, &mut one).unwrap();
    assert!(rel_err(&convert_to_f32(&one), &dk_ref) < tol, "{name}: grad_k");
    ctx.grad_v(shape, &tdo, &tq, &tk, &lse, &mut one).unwrap();
    assert!(rel_err(&convert_to_f32(&one), &dv_ref) < tol, "{name}: grad_v");
    if p.sinks.is_some() {
        let mut ds = vec![f32::NAN; p.heads];
        ctx.grad_sinks(shape, &o, &lse, &tdo, &mut ds).unwrap();
        assert!(rel_err(&ds, &ds_ref) < tol, "{name}: grad_sinks {ds:?} against {ds_ref:?}");
    }
}

#[test]
fn every_op_in_float32_against_float64() {
    for (backend, ctx) in contexts() {
        for (name, p) in cases() {
            let shape = p.shape().build().unwrap();
            check_ops::<f32>(&ctx, &format!("{backend} {name}"), &p, &shape, TOL_F32);
        }
    }
}

#[test]
fn sixteen_bit_elements() {
    for (backend, ctx) in contexts() {
        let (_, p) = cases().swap_remove(1);
        let shape = p.shape().build().unwrap();
        check_ops::<Bf16>(&ctx, &format!("{backend} bf16"), &p, &shape, 3e-2);
        check_ops::<F16>(&ctx, &format!("{backend} f16"), &p, &shape, 4e-3);
    }
}

#[test]
fn dropout_follows_its_mask() {
    for (backend, ctx) in contexts() {
        let mut p = Problem::new(2, 14, 20, 2, 1, 16);
        p.causal = Causal::BottomRight;
        let shape = p.shape().dropout(0.3, 1234, 5).build().unwrap();
        let mut masks = Vec::new();
        for b in 0..2 {
            for h in 0..2 {
                masks.push(shape.dropout_mask(b, h).unwrap());
            }
        }
        let kept: usize = masks.iter().flatten().map(|&x| x as usize).sum();
        assert!(kept > 0 && kept < masks.iter().map(Vec::len).sum::<usize>());
        p.dropout = Some((0.3f32 as f64, masks));
        check_ops::<f32>(&ctx, &format!("{backend} dropout"), &p, &shape, TOL_F32);
    }
}

#[test]
fn packed_sequences_are_each_their_own_problem() {
    for (backend, ctx) in contexts() {
        let (cu_q, cu_k) = ([0u32, 7, 7, 20], [0u32, 9, 12, 25]);
        let (h, d) = (2usize, 16usize);
        let shape = Shape::builder(0, 20, 25, 2, 2, 16)
            .causal(Causal::BottomRight)
            .packed(&cu_q, &cu_k)
            .build()
            .unwrap();
        assert_eq!((shape.batch(), shape.q_len()), (3, 20 * h * d));
        let (q, k, v) =
            (random(shape.q_len(), 5), random(shape.kv_len(), 6), random(shape.kv_len(), 7));
        let mut o = vec![f32::NAN; shape.q_len()];
        let mut lse = vec![f32::NAN; shape.lse_len()];
        ctx.forward(&shape, &q, &k, &v, &mut o, &mut lse).unwrap();
        for s in 0..3 {
            let (q0, q1, k0, k1) =
                (cu_q[s] as usize, cu_q[s + 1] as usize, cu_k[s] as usize, cu_k[s + 1] as usize);
            if q1 == q0 {
                continue;
            }
            let mut p = Problem::new(1, q1 - q0, k1 - k0, h, h, d);
            p.causal = Causal::BottomRight;
            let rows = |a: &[f32], r0: usize, r1: usize| a[r0 * h * d..r1 * h * d].to_vec();
            let (want, _) = p.forward(&rows(&q, q0, q1), &rows(&k, k0, k1), &rows(&v, k0, k1));
            let e = rel_err(&o[q0 * h * d..q1 * h * d], &want);
            assert!(e < TOL_F32, "{backend}: sequence {s} off by {e}");
        }
    }
}

#[test]
fn merged_key_chunks_are_the_whole() {
    for (backend, ctx) in contexts() {
        let (b, sq, sk, h, d) = (1u32, 12u32, 30u32, 2u32, 16u32);
        let whole = Shape::builder(b, sq, sk, h, h, d).causal(Causal::BottomRight).build().unwrap();
        let q = random(whole.q_len(), 8);
        let (k, v) = (random(whole.kv_len(), 9), random(whole.kv_len(), 10));
        let mut o = vec![0.0f32; whole.q_len()];
        let mut lse = vec![0.0f32; whole.lse_len()];
        ctx.forward(&whole, &q, &k, &v, &mut o, &mut lse).unwrap();
        // keys [0, 11) and [11, 30), bottom-right as offsets
        let split = 11u32;
        let rows =
            |a: &[f32], r0: u32, r1: u32| a[(r0 * h * d) as usize..(r1 * h * d) as usize].to_vec();
        let shift = sk - sq;
        let first = Shape::builder(b, sq, split, h, h, d)
            .causal(Causal::TopLeft)
            .offsets(shift, 0)
            .build()
            .unwrap();
        let second = Shape::builder(b, sq, sk - split, h, h, d)
            .causal(Causal::TopLeft)
            .offsets(shift, split)
            .build()
            .unwrap();
        let (mut o1, mut l1) = (vec![0.0f32; whole.q_len()], vec![0.0f32; whole.lse_len()]);
        let (mut o2, mut l2) = (vec![0.0f32; whole.q_len()], vec![0.0f32; whole.lse_len()]);
        ctx.forward(&first, &q, &rows(&k, 0, split), &rows(&v, 0, split), &mut o1, &mut l1)
            .unwrap();
        ctx.forward(&second, &q, &rows(&k, split, sk), &rows(&v, split, sk), &mut o2, &mut l2)
            .unwrap();
        ctx.merge_into(&whole, &mut o1, &mut l1, &o2, &l2).unwrap();
        let want: Vec<f64> = o.iter().map(|&x| x as f64).collect();
        assert!(rel_err(&o1, &want) < 1e-5, "{backend}: merge");
    }
}

#[test]
fn the_seed_block_runs_grad_v() {
    // meganeura's Params: q_seq 24, causal (kv_seq 0), 4 heads on 2, d 64.
    let shape = Shape::from_seed([24, 0, 4 << 16 | 2, 64, 0, 0, 0, 0]).unwrap();
    assert_eq!((shape.kv_seq(), shape.num_heads(), shape.num_kv_heads()), (24, 4, 2));
    let mut p = Problem::new(1, 24, 24, 4, 2, 64);
    p.causal = Causal::TopLeft;
    for (backend, ctx) in contexts() {
        let (q, k, v, d_out) =
            (random(p.nq(), 11), random(p.nkv(), 12), random(p.nkv(), 13), random(p.nq(), 14));
        let (mut o, mut lse) = (vec![0.0f32; p.nq()], vec![0.0f32; shape.lse_len()]);
        ctx.forward(&shape, &q, &k, &v, &mut o, &mut lse).unwrap();
        let mut dv = vec![f32::NAN; p.nkv()];
        ctx.grad_v(&shape, &d_out, &q, &k, &lse, &mut dv).unwrap();
        let (_, _, want, _) = p.backward(&q, &k, &v, &d_out);
        assert!(rel_err(&dv, &want) < TOL_F32, "{backend}: the seed's grad-V");
    }
}
