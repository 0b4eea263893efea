//! The seed's own call: meganeura's attention gradient with respect to V
//! (`mha_grad_v.wgsl`), from its `Params` uniform block, on clattn. A
//! framework puts clattn behind its attention dispatch where no Vulkan,
//! Metal or DX12 device exists: the same block and buffers, another
//! backend.
//!
//! cargo run --example seed_grad_v [-- DEVICE]
use clattn::{Context, Shape};

/// meganeura's `Params` for the grad-V kernel: {q_seq, kv_seq (0: causal
/// self-attention), num_heads << 16 | num_kv_heads, head_dim, window_size,
/// pad, pad, pad}.
type Params = [u32; 8];

/// What an attention dispatch does on a machine without a WGSL device:
/// dV from dO, Q, K and the forward's LSE pairs through clattn.
fn grad_v_without_gpu_api(
    ctx: &Context,
    params: Params,
    d_out: &[f32],
    q: &[f32],
    k: &[f32],
    lse: &[f32],
) -> Result<Vec<f32>, clattn::Error> {
    let shape = Shape::from_seed(params)?;
    let mut dv = vec![0.0f32; shape.kv_len()];
    ctx.grad_v(&shape, d_out, q, k, lse, &mut dv)?;
    Ok(dv)
}

fn main() -> Result<(), clattn::Error> {
    let device = std::env::args().nth(1).unwrap_or_else(|| "auto".to_string());
    let ctx = Context::on(&device)?;
    // 128 tokens, causal, 8 query heads on 2 KV heads, head_dim 64, a
    // 32-token sliding window: one layer of a small GQA model.
    let params: Params = [128, 0, 8 << 16 | 2, 64, 32, 0, 0, 0];
    let shape = Shape::from_seed(params)?;
    let fill =
        |n: usize, k: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * k).sin() * 0.5).collect() };
    let (q, kk, v, d_out) = (
        fill(shape.q_len(), 0.37),
        fill(shape.kv_len(), 0.11),
        fill(shape.kv_len(), 0.23),
        fill(shape.q_len(), 0.71),
    );
    // The forward gives the LSE pairs the seed's kernel reads.
    let mut o = vec![0.0f32; shape.q_len()];
    let mut lse = vec![0.0f32; shape.lse_len()];
    ctx.forward(&shape, &q, &kk, &v, &mut o, &mut lse)?;
    let dv = grad_v_without_gpu_api(&ctx, params, &d_out, &q, &kk, &lse)?;
    let norm = dv.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>().sqrt();
    println!(
        "{}: grad-V of {} x {} heads x {} on {} ({} kernels), |dV| = {norm:.6}",
        ctx.device(),
        shape.q_seq(),
        shape.num_heads(),
        shape.head_dim(),
        ctx.variant(),
        ctx.kernels()
    );
    Ok(())
}
