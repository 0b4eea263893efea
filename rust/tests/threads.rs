//! One context shared by threads gives each the bytes one thread gets.
mod common;

use clattn::{Causal, Shape};
use common::{contexts, random};

#[test]
fn threads_on_one_context_match_one_thread() {
    for (backend, ctx) in contexts() {
        let shape =
            Shape::builder(2, 33, 41, 4, 2, 32).causal(Causal::BottomRight).build().unwrap();
        type Inputs = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);
        let inputs: Vec<Inputs> = (0..4u64)
            .map(|s| {
                (
                    random(shape.q_len(), 10 * s),
                    random(shape.kv_len(), 10 * s + 1),
                    random(shape.kv_len(), 10 * s + 2),
                    random(shape.q_len(), 10 * s + 3),
                )
            })
            .collect();
        let run = |i: usize| -> Vec<f32> {
            let (q, k, v, d_out) = &inputs[i];
            let mut o = vec![0.0f32; shape.q_len()];
            let mut lse = vec![0.0f32; shape.lse_len()];
            ctx.forward(&shape, q, k, v, &mut o, &mut lse).unwrap();
            let (mut dq, mut dk, mut dv) = (
                vec![0.0f32; shape.q_len()],
                vec![0.0f32; shape.kv_len()],
                vec![0.0f32; shape.kv_len()],
            );
            ctx.backward(&shape, q, k, v, &o, &lse, d_out, &mut dq, &mut dk, &mut dv).unwrap();
            [o, lse, dq, dk, dv].concat()
        };
        let alone: Vec<Vec<f32>> = (0..4).map(run).collect();
        let together: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|i| s.spawn(move || (0..3).map(|_| run(i)).collect::<Vec<_>>()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, runs) in together.iter().enumerate() {
            for got in runs {
                assert!(
                    alone[i].iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{backend}: thread {i}"
                );
            }
        }
    }
}
