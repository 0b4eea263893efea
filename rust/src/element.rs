//! The tensors' element types: `f32`, [`F16`] and [`Bf16`], converted as
//! the library converts them.

use std::os::raw::c_void;

use crate::sys;

/// A tensor element: `f32`, [`F16`] or [`Bf16`].
pub trait Element: Copy + private::Sealed {
    const DTYPE: sys::clattn_dtype;
    /// This element's value in float32 (exact).
    fn to_f32(self) -> f32;
    /// The element nearest x (ties to even; NaN stays NaN).
    fn from_f32(x: f32) -> Self;
}

mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::F16 {}
    impl Sealed for super::Bf16 {}
}

impl Element for f32 {
    const DTYPE: sys::clattn_dtype = sys::CLATTN_DTYPE_F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> f32 {
        x
    }
}

/// IEEE binary16, as its bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct F16(pub u16);

/// bfloat16 (the top half of a binary32), as its bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Bf16(pub u16);

fn convert_in(dtype: sys::clattn_dtype, bits: u16) -> f32 {
    let mut out = 0.0f32;
    // SAFETY: one element each way.
    unsafe { sys::clattn_to_f32(dtype, &bits as *const u16 as *const c_void, &mut out, 1) };
    out
}

fn convert_out(dtype: sys::clattn_dtype, x: f32) -> u16 {
    let mut bits = 0u16;
    // SAFETY: one element each way.
    unsafe { sys::clattn_from_f32(dtype, &x, &mut bits as *mut u16 as *mut c_void, 1) };
    bits
}

impl Element for F16 {
    const DTYPE: sys::clattn_dtype = sys::CLATTN_DTYPE_F16;
    fn to_f32(self) -> f32 {
        convert_in(Self::DTYPE, self.0)
    }
    fn from_f32(x: f32) -> F16 {
        F16(convert_out(Self::DTYPE, x))
    }
}

impl Element for Bf16 {
    const DTYPE: sys::clattn_dtype = sys::CLATTN_DTYPE_BF16;
    fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
    fn from_f32(x: f32) -> Bf16 {
        Bf16(convert_out(Self::DTYPE, x))
    }
}

/// Converts float32 values to elements of T, as clattn rounds them.
pub fn convert_from_f32<T: Element>(x: &[f32]) -> Vec<T> {
    x.iter().map(|&v| T::from_f32(v)).collect()
}

/// Converts elements of T to float32, exactly.
pub fn convert_to_f32<T: Element>(x: &[T]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}
