//! The tests' float64 reference, written here apart from the library, and
//! their helpers.
#![allow(dead_code)]

use clattn::{Causal, Context, Shape};

/// One attention problem as the reference reads it.
#[derive(Clone, Debug, Default)]
pub struct Problem {
    pub batch: usize,
    pub sq: usize,
    pub sk: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub d: usize,
    pub causal: Causal,
    pub window: usize,
    pub right: usize,
    pub q_offset: i64,
    pub kv_offset: i64,
    pub scale: Option<f64>,
    pub softcap: f64,
    pub slopes: Option<Vec<f32>>,
    pub sinks: Option<Vec<f32>>,
    /// Dropout: p, and the keep masks per (batch, head), sq * sk each.
    pub dropout: Option<(f64, Vec<Vec<u8>>)>,
}

impl Problem {
    pub fn new(
        batch: usize,
        sq: usize,
        sk: usize,
        heads: usize,
        kv_heads: usize,
        d: usize,
    ) -> Problem {
        Problem { batch, sq, sk, heads, kv_heads, d, ..Problem::default() }
    }

    /// The library's shape for it (without dropout, which needs a seed).
    pub fn shape(&self) -> clattn::ShapeBuilder {
        let mut b = Shape::builder(
            self.batch as u32,
            self.sq as u32,
            self.sk as u32,
            self.heads as u32,
            self.kv_heads as u32,
            self.d as u32,
        )
        .causal(self.causal)
        .window(self.window as u32)
        .window_right(self.right as u32)
        .offsets(self.q_offset as u32, self.kv_offset as u32)
        .softcap(self.softcap as f32);
        if let Some(s) = self.scale {
            b = b.scale(s as f32);
        }
        if let Some(s) = &self.slopes {
            b = b.alibi_slopes(s);
        }
        if let Some(s) = &self.sinks {
            b = b.sinks(s);
        }
        b
    }

    pub fn nq(&self) -> usize {
        self.batch * self.sq * self.heads * self.d
    }

    pub fn nkv(&self) -> usize {
        self.batch * self.sk * self.kv_heads * self.d
    }

    fn scale(&self) -> f64 {
        self.scale.unwrap_or(1.0 / (self.d as f64).sqrt())
    }

    /// Global positions of query row i and key j.
    fn positions(&self, i: usize, j: usize) -> (i64, i64) {
        let shift =
            if self.causal == Causal::BottomRight { self.sk as i64 - self.sq as i64 } else { 0 };
        (i as i64 + self.q_offset + shift, j as i64 + self.kv_offset)
    }

    fn visible(&self, i: usize, j: usize) -> bool {
        let (p, t) = self.positions(i, j);
        (self.causal == Causal::None || t <= p + self.right as i64)
            && (self.window == 0 || p < t + self.window as i64)
    }

    /// The modified score and its derivative in the scaled score.
    fn score(&self, q: &[f32], k: &[f32], b: usize, i: usize, h: usize, j: usize) -> (f64, f64) {
        let qa = ((b * self.sq + i) * self.heads + h) * self.d;
        let ka = ((b * self.sk + j) * self.kv_heads + h / (self.heads / self.kv_heads)) * self.d;
        let dot: f64 = (0..self.d).map(|x| q[qa + x] as f64 * k[ka + x] as f64).sum();
        let mut s = dot * self.scale();
        let mut g = 1.0;
        if self.softcap > 0.0 {
            let th = (s / self.softcap).tanh();
            s = self.softcap * th;
            g = 1.0 - th * th;
        }
        if let Some(sl) = &self.slopes {
            let (p, t) = self.positions(i, j);
            s -= sl[h] as f64 * (p - t).abs() as f64;
        }
        (s, g)
    }

    fn keep(&self, b: usize, h: usize, i: usize, j: usize) -> f64 {
        match &self.dropout {
            None => 1.0,
            Some((p, masks)) => {
                if masks[b * self.heads + h][i * self.sk + j] != 0 {
                    1.0 / (1.0 - p)
                } else {
                    0.0
                }
            }
        }
    }

    /// O, and each row's log-sum-exp L (-inf where the row sees nothing).
    pub fn forward(&self, q: &[f32], k: &[f32], v: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let mut o = vec![0.0; self.nq()];
        let mut lse = vec![f64::NEG_INFINITY; self.batch * self.sq * self.heads];
        let group = self.heads / self.kv_heads;
        for b in 0..self.batch {
            for i in 0..self.sq {
                for h in 0..self.heads {
                    let row = (b * self.sq + i) * self.heads + h;
                    let z: Vec<(usize, f64)> = (0..self.sk)
                        .filter(|&j| self.visible(i, j))
                        .map(|j| (j, self.score(q, k, b, i, h, j).0))
                        .collect();
                    let sink = self.sinks.as_ref().map(|s| s[h] as f64);
                    let mut m = z.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
                    if let Some(s) = sink {
                        m = m.max(s);
                    }
                    if m == f64::NEG_INFINITY {
                        continue;
                    }
                    let mut sum: f64 = z.iter().map(|x| (x.1 - m).exp()).sum();
                    if let Some(s) = sink {
                        sum += (s - m).exp();
                    }
                    let l = m + sum.ln();
                    lse[row] = l;
                    for &(j, s) in &z {
                        let p = (s - l).exp() * self.keep(b, h, i, j);
                        let va = ((b * self.sk + j) * self.kv_heads + h / group) * self.d;
                        for x in 0..self.d {
                            o[row * self.d + x] += p * v[va + x] as f64;
                        }
                    }
                }
            }
        }
        (o, lse)
    }

    /// dQ, dK, dV and the sinks' gradient of sum(dO * O).
    pub fn backward(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        d_out: &[f32],
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let (o, lse) = self.forward(q, k, v);
        let (mut dq, mut dk, mut dv) =
            (vec![0.0; self.nq()], vec![0.0; self.nkv()], vec![0.0; self.nkv()]);
        let mut ds_sink = vec![0.0; self.heads];
        let group = self.heads / self.kv_heads;
        let scale = self.scale();
        for b in 0..self.batch {
            for i in 0..self.sq {
                for h in 0..self.heads {
                    let row = (b * self.sq + i) * self.heads + h;
                    let l = lse[row];
                    if l == f64::NEG_INFINITY {
                        continue;
                    }
                    let dor = &d_out[row * self.d..(row + 1) * self.d];
                    let dsum: f64 = (0..self.d).map(|x| dor[x] as f64 * o[row * self.d + x]).sum();
                    if let Some(s) = &self.sinks {
                        ds_sink[h] -= (s[h] as f64 - l).exp() * dsum;
                    }
                    let qa = row * self.d;
                    for j in (0..self.sk).filter(|&j| self.visible(i, j)) {
                        let (s, g) = self.score(q, k, b, i, h, j);
                        let p0 = (s - l).exp();
                        let keep = self.keep(b, h, i, j);
                        let ka = ((b * self.sk + j) * self.kv_heads + h / group) * self.d;
                        let dp: f64 = (0..self.d).map(|x| dor[x] as f64 * v[ka + x] as f64).sum();
                        let ds = p0 * (keep * dp - dsum) * g * scale;
                        for x in 0..self.d {
                            dv[ka + x] += p0 * keep * dor[x] as f64;
                            dq[qa + x] += ds * k[ka + x] as f64;
                            dk[ka + x] += ds * q[qa + x] as f64;
                        }
                    }
                }
            }
        }
        (dq, dk, dv, ds_sink)
    }
}

/// Uniform values in [-1, 1) from a seed (a 64-bit LCG's top bits).
pub fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((x >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

/// max |got - want| / max |want| (0 where both are 0).
pub fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |a, &w| a.max(w.abs()));
    let worst = got.iter().zip(want).fold(0.0f64, |a, (&g, &w)| a.max((g as f64 - w).abs()));
    if scale == 0.0 {
        worst
    } else {
        worst / scale
    }
}

/// The backends the tests run on: CLATTN_RUST_BACKENDS (comma-separated
/// selectors, e.g. "native,cpu"), else native alone. Each must open: a
/// listed backend that is absent fails the test.
pub fn contexts() -> Vec<(String, Context)> {
    let list = std::env::var("CLATTN_RUST_BACKENDS").unwrap_or_else(|_| "native".to_string());
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|sel| {
            let ctx = Context::on(sel).unwrap_or_else(|e| panic!("backend {sel}: {e}"));
            (sel.to_string(), ctx)
        })
        .collect()
}
