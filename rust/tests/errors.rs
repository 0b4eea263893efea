//! Bad input gives an Error with the library's status and message, and
//! nothing is written.
use clattn::{sys, Causal, Context, Options, Shape};

fn native() -> Context {
    Context::on("native").unwrap()
}

#[test]
fn bad_shapes_are_errors() {
    let cases: Vec<(clattn::Result<Shape>, i32, &str)> = vec![
        (Shape::builder(1, 0, 8, 2, 2, 8).build(), sys::CLATTN_ERROR_ZERO_SIZE, "zero size"),
        (
            Shape::builder(1, 8, 8, 3, 2, 8).build(),
            sys::CLATTN_ERROR_HEADS_NOT_DIVISIBLE,
            "not a multiple",
        ),
        (
            Shape::builder(1, 8, 8, 2, 2, 300).build(),
            sys::CLATTN_ERROR_HEAD_DIM_TOO_LARGE,
            "above 256",
        ),
        (
            Shape::builder(1, 8, 8, 2, 2, 8).scale(f32::NAN).build(),
            sys::CLATTN_ERROR_INVALID_SCALE,
            "",
        ),
        (
            Shape::builder(1, 8, 8, 2, 2, 8).dropout(1.0, 1, 0).build(),
            sys::CLATTN_ERROR_INVALID_MODIFIER,
            "dropout_p",
        ),
        (
            Shape::builder(1, 8, 8, 2, 2, 8).softcap(-1.0).build(),
            sys::CLATTN_ERROR_INVALID_MODIFIER,
            "softcap",
        ),
        (
            Shape::builder(1, 8, 8, 2, 2, 8).sinks(&[0.0]).build(),
            sys::CLATTN_ERROR_INVALID_MODIFIER,
            "sinks",
        ),
        (
            Shape::builder(1, 8, 8, 2, 2, 8).sinks(&[0.0, f32::NAN]).build(),
            sys::CLATTN_ERROR_INVALID_MODIFIER,
            "sinks[1]",
        ),
        (
            Shape::builder(1, 8, 8, 2, 2, 8).alibi_slopes(&[1.0, 2.0, 3.0]).build(),
            sys::CLATTN_ERROR_INVALID_MODIFIER,
            "alibi",
        ),
        (
            Shape::builder(1, 8, 8, 2, 2, 8).window_right(3).build(),
            sys::CLATTN_ERROR_INVALID_OPTION,
            "causal",
        ),
        (
            Shape::builder(0, 8, 8, 2, 2, 8).packed(&[0, 5, 3], &[0, 4, 8]).build(),
            sys::CLATTN_ERROR_INVALID_SEQLENS,
            "decreases",
        ),
        (
            Shape::builder(0, 8, 8, 2, 2, 8).packed(&[0, 5], &[0, 4, 8]).build(),
            sys::CLATTN_ERROR_INVALID_SEQLENS,
            "batch + 1",
        ),
        (
            Shape::from_seed([8, 0, 3 << 16 | 2, 64, 0, 0, 0, 0]),
            sys::CLATTN_ERROR_HEADS_NOT_DIVISIBLE,
            "",
        ),
    ];
    for (i, (got, status, says)) in cases.into_iter().enumerate() {
        let e = got.expect_err(&format!("case {i} built"));
        assert_eq!(e.status(), status, "case {i}: {e}");
        assert!(e.message().contains(says), "case {i}: {e}");
        assert!(e.to_string().starts_with("CLATTN_ERROR_"), "case {i}: {e}");
    }
}

#[test]
fn wrong_lengths_are_errors_and_nothing_is_written() {
    let ctx = native();
    let shape = Shape::builder(1, 8, 8, 2, 2, 8).causal(Causal::TopLeft).build().unwrap();
    let (q, k, v) =
        (vec![0.5f32; shape.q_len()], vec![0.5f32; shape.kv_len()], vec![0.5f32; shape.kv_len()]);
    let mut o = vec![42.0f32; shape.q_len()];
    let mut lse = vec![42.0f32; shape.lse_len()];
    let e = ctx.forward(&shape, &q[1..], &k, &v, &mut o, &mut lse).unwrap_err();
    assert_eq!(e.status(), sys::CLATTN_ERROR_INVALID_BUFFER);
    assert!(e.message().contains("q holds 127"), "{e}");
    let e = ctx.forward(&shape, &q, &k, &v, &mut o, &mut lse[..3]).unwrap_err();
    assert!(e.message().contains("lse"), "{e}");
    assert!(o.iter().chain(&lse).all(|&x| x == 42.0));
    let mut ds = vec![42.0f32; 2];
    let e = ctx.grad_sinks(&shape, &o, &lse, &q, &mut ds).unwrap_err();
    assert_eq!(e.status(), sys::CLATTN_ERROR_NULL_POINTER, "{e}"); // no sinks in the shape
    let mut dv = vec![42.0f32; 3];
    assert!(ctx.grad_v(&shape, &q, &q, &k, &lse, &mut dv).is_err());
    assert!(shape.dropout_mask(0, 2).is_err()); // head past num_heads
}

#[test]
fn bad_options_are_errors() {
    let e =
        Context::new(&Options { device: Some("no-such-device-xyz".into()), ..Options::default() })
            .unwrap_err();
    assert_eq!(e.status(), sys::CLATTN_ERROR_DEVICE_NOT_FOUND, "{e}");
    let e =
        Context::new(&Options { variant: Some("a\0b".into()), ..Options::default() }).unwrap_err();
    assert_eq!(e.status(), sys::CLATTN_ERROR_INVALID_OPTION, "{e}");
    let e = Context::new(&Options {
        device: Some("native".into()),
        variant: Some("nope".into()),
        ..Options::default()
    })
    .unwrap_err();
    assert_eq!(e.status(), sys::CLATTN_ERROR_UNKNOWN_VARIANT, "{e}");
    let e = Context::new(&Options { num_threads: u32::MAX, ..Options::default() }).unwrap_err();
    assert_eq!(e.status(), sys::CLATTN_ERROR_INVALID_OPTION, "{e}");
}

#[test]
fn the_context_and_devices_describe_themselves() {
    let ctx = native();
    assert_eq!(ctx.backend(), clattn::Backend::Native);
    assert!(ctx.device().starts_with("native"));
    assert!(!clattn::version().is_empty());
    let list = clattn::devices().unwrap();
    assert!(list.iter().any(|d| d.backend == clattn::Backend::Native && d.index.is_none()));
    assert!(!clattn::variants(clattn::Backend::Native).is_empty());
}
