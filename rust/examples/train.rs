//! One causal attention layer whose Q, K and V are parameters, trained with
//! Adam through clattn's forward and backward to reproduce a fixed random
//! target layer's output, as `clattn train` does. Prints the loss as it
//! falls; exits 1 unless it fell at least 100-fold.
//!
//! cargo run --example train [-- DEVICE [STEPS]]   (DEVICE: "native", "cpu", "gpu", ...)
use clattn::{Causal, Context, Shape};

struct Adam {
    m: Vec<f32>,
    v: Vec<f32>,
}

impl Adam {
    fn new(n: usize) -> Adam {
        Adam { m: vec![0.0; n], v: vec![0.0; n] }
    }

    fn step(&mut self, x: &mut [f32], g: &[f32], t: i32, lr: f32) {
        let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
        let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        for i in 0..x.len() {
            self.m[i] = b1 * self.m[i] + (1.0 - b1) * g[i];
            self.v[i] = b2 * self.v[i] + (1.0 - b2) * g[i] * g[i];
            x[i] -= lr * (self.m[i] / c1) / ((self.v[i] / c2).sqrt() + eps);
        }
    }
}

fn random(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((*seed >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

fn main() -> Result<(), clattn::Error> {
    let args: Vec<String> = std::env::args().collect();
    let device = args.get(1).map(String::as_str).unwrap_or("auto");
    let steps: i32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(300);
    let ctx = Context::on(device)?;
    println!("training on {}", ctx.device());
    let shape = Shape::builder(1, 64, 64, 4, 2, 16).causal(Causal::TopLeft).build()?;
    let (nq, nkv, nl) = (shape.q_len(), shape.kv_len(), shape.lse_len());
    let mut seed = 7u64;
    // The target layer's output.
    let (tq, tk, tv) = (random(nq, &mut seed), random(nkv, &mut seed), random(nkv, &mut seed));
    let mut target = vec![0.0f32; nq];
    let mut lse = vec![0.0f32; nl];
    ctx.forward(&shape, &tq, &tk, &tv, &mut target, &mut lse)?;
    // The layer being trained, from small random weights.
    let mut params: Vec<Vec<f32>> = [nq, nkv, nkv]
        .iter()
        .map(|&n| random(n, &mut seed).iter().map(|x| 0.1 * x).collect())
        .collect();
    let mut adam: Vec<Adam> = params.iter().map(|p| Adam::new(p.len())).collect();
    let (mut o, mut d_out) = (vec![0.0f32; nq], vec![0.0f32; nq]);
    let mut grads = [vec![0.0f32; nq], vec![0.0f32; nkv], vec![0.0f32; nkv]];
    let (mut first, mut last) = (0.0f64, 0.0f64);
    for step in 1..=steps {
        ctx.forward(&shape, &params[0], &params[1], &params[2], &mut o, &mut lse)?;
        // loss = mean (o - target)^2; dO = 2 (o - target) / n
        let mut loss = 0.0f64;
        for i in 0..nq {
            let diff = o[i] - target[i];
            loss += (diff as f64) * (diff as f64) / nq as f64;
            d_out[i] = 2.0 * diff / nq as f32;
        }
        let (gq, rest) = grads.split_at_mut(1);
        let (gk, gv) = rest.split_at_mut(1);
        ctx.backward(
            &shape, &params[0], &params[1], &params[2], &o, &lse, &d_out, &mut gq[0], &mut gk[0],
            &mut gv[0],
        )?;
        for i in 0..3 {
            adam[i].step(&mut params[i], &grads[i], step, 0.02);
        }
        if step == 1 {
            first = loss;
        }
        last = loss;
        if step == 1 || step % (steps / 10).max(1) == 0 {
            println!("step {step}/{steps} loss {loss:.6e}");
        }
    }
    let fell = first / last;
    println!("loss fell {fell:.1}-fold: {}", if fell >= 100.0 { "ok" } else { "not enough" });
    if fell < 100.0 {
        std::process::exit(1);
    }
    Ok(())
}
