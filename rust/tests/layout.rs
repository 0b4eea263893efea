//! Every struct of `sys` against the C compiler's layout of the header:
//! tests/python_layout.c, compiled here with the system's C compiler,
//! prints each size and field offset.
use std::mem::{size_of, MaybeUninit};
use std::path::PathBuf;
use std::process::Command;

use clattn::sys;

macro_rules! offset {
    ($t:ty, $f:ident) => {{
        let u = MaybeUninit::<$t>::uninit();
        let base = u.as_ptr();
        // SAFETY: only the field's address is taken, nothing is read.
        let field = unsafe { std::ptr::addr_of!((*base).$f) };
        field as usize - base as usize
    }};
}

fn rust_layout() -> Vec<(String, usize)> {
    let mut v = vec![("clattn_shape:sizeof".to_string(), size_of::<sys::clattn_shape>())];
    macro_rules! fields {
        ($t:ty, $name:expr, $($f:ident),*) => {
            $(v.push((format!("{}:{}", $name, stringify!($f)), offset!($t, $f)));)*
        };
    }
    fields!(
        sys::clattn_shape,
        "clattn_shape",
        batch,
        q_seq,
        kv_seq,
        num_heads,
        num_kv_heads,
        head_dim,
        causal,
        window,
        window_right,
        scale,
        dtype,
        q_offset,
        kv_offset,
        accumulate,
        cu_seqlens_q,
        cu_seqlens_kv,
        softcap,
        alibi_slopes,
        dropout_p,
        dropout_seed,
        dropout_offset,
        sinks,
        score_fn,
        mask_fn,
        score_params,
        score_params_count,
        score_native,
        score_ds_native,
        mask_native,
        bias,
        bool_mask,
        bias_batch,
        bias_heads,
        bias_cl,
        bool_mask_cl,
        score_span_native,
        bias_dtype,
        score_dp_native
    );
    v.push(("clattn_options:sizeof".to_string(), size_of::<sys::clattn_options>()));
    fields!(sys::clattn_options, "clattn_options", backend, device, variant, num_threads);
    v.push(("clattn_device_info:sizeof".to_string(), size_of::<sys::clattn_device_info>()));
    fields!(
        sys::clattn_device_info,
        "clattn_device_info",
        backend,
        platform_index,
        device_index,
        platform,
        name
    );
    v
}

#[test]
fn structs_match_the_c_header() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let probe_src = manifest.join("../tests/python_layout.c");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("clattn_layout_probe");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let mut cmd = Command::new(&cc);
    cmd.arg("-std=c99").arg(&probe_src).arg("-o").arg(&out);
    for dir in env!("CLATTN_INCLUDE_DIRS").split(':') {
        cmd.arg(format!("-I{dir}"));
    }
    let built = cmd.status().unwrap_or_else(|e| panic!("cannot run the C compiler {cc}: {e}"));
    assert!(built.success(), "the layout probe did not compile");
    let printed = Command::new(&out).output().expect("the layout probe did not run");
    let text = String::from_utf8(printed.stdout).unwrap();
    let c: Vec<(String, usize)> = text
        .split_whitespace()
        .map(|item| {
            let (key, value) = item.rsplit_once(':').unwrap();
            (key.to_string(), value.parse().unwrap())
        })
        .collect();
    let rust = rust_layout();
    assert_eq!(
        c.len(),
        rust.len(),
        "the probe printed {} entries, Rust has {}",
        c.len(),
        rust.len()
    );
    for (key, value) in &c {
        let mine =
            rust.iter().find(|(k, _)| k == key).unwrap_or_else(|| panic!("{key}: not in Rust"));
        assert_eq!(mine.1, *value, "{key}: Rust {} against C {value}", mine.1);
    }
}
