//! What the machine offers: its devices and each backend's variants.

use std::ptr;

use crate::{check, sys, text, Backend, Result};

/// One device as `clattn_list_devices` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub backend: Backend,
    /// OpenCL platform and device index ("P:D"); None for native.
    pub index: Option<(u32, u32)>,
    pub platform: String,
    pub name: String,
}

/// Every OpenCL device, then the native backend.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let mut count = 0usize;
    // SAFETY: capacity 0 with NULL asks for the count.
    check(unsafe { sys::clattn_list_devices(ptr::null_mut(), 0, &mut count) })?;
    // SAFETY: zeroed C data.
    let mut raw: Vec<sys::clattn_device_info> = vec![unsafe { std::mem::zeroed() }; count];
    let mut got = 0usize;
    // SAFETY: raw holds count entries.
    check(unsafe { sys::clattn_list_devices(raw.as_mut_ptr(), count, &mut got) })?;
    raw.truncate(got.min(count));
    Ok(raw
        .iter()
        .map(|d| DeviceInfo {
            backend: Backend::from_raw(d.backend),
            index: if d.platform_index < 0 {
                None
            } else {
                Some((d.platform_index as u32, d.device_index as u32))
            },
            // SAFETY: NUL-terminated within their 128 bytes.
            platform: unsafe { text(d.platform.as_ptr()) },
            name: unsafe { text(d.name.as_ptr()) },
        })
        .collect())
}

/// The kernel variants a backend offers, its default first.
pub fn variants(backend: Backend) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0.. {
        // SAFETY: a static string or NULL past the last.
        let p = unsafe { sys::clattn_variant_name(backend.raw(), i) };
        if p.is_null() {
            break;
        }
        out.push(unsafe { text(p) });
    }
    out
}
