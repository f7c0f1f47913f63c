//! The warm driver when persistence mode is not available: `mqfqd` holds the primary CUDA
//! context of every GPU, so the driver stays initialized and a new container's first CUDA call
//! does not pay for it. `libcuda.so.1` is loaded at run time and checked before any call: a node
//! without it is a logged state, never a panic.

use libloading::{Library, Symbol};

/// Why contexts could not be held.
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    /// The library is missing or lacks a symbol.
    #[error("{0}")]
    Load(#[from] libloading::Error),
    /// A driver call failed.
    #[error("{call} returned CUDA error {code}")]
    Cuda {
        /// The call.
        call: &'static str,
        /// The CUresult.
        code: i32,
    },
}

type CuInit = unsafe extern "C" fn(u32) -> i32;
type CuDeviceGetCount = unsafe extern "C" fn(*mut i32) -> i32;
type CuDeviceGet = unsafe extern "C" fn(*mut i32, i32) -> i32;
type CuPrimaryCtxRetain = unsafe extern "C" fn(*mut *mut std::ffi::c_void, i32) -> i32;
type CuPrimaryCtxRelease = unsafe extern "C" fn(i32) -> i32;

/// Primary contexts held until dropped.
#[derive(Debug)]
pub struct HeldContexts {
    lib: Library,
    devices: Vec<i32>,
}

fn check(call: &'static str, code: i32) -> Result<(), WarmError> {
    if code == 0 {
        Ok(())
    } else {
        Err(WarmError::Cuda { call, code })
    }
}

impl HeldContexts {
    /// Loads `library` and retains the primary context of every device.
    ///
    /// # Errors
    /// The library or a symbol is missing, or a driver call fails (no device, no permission).
    pub fn hold(library: &str) -> Result<Self, WarmError> {
        // SAFETY: loading the CUDA driver runs its initializers, which have no preconditions
        // on our side; a missing file is an error, not UB.
        let lib = unsafe { Library::new(library) }?;
        let mut devices = Vec::new();
        // SAFETY: each symbol is looked up with the signature the CUDA driver API documents for
        // it, and called with valid out-pointers.
        unsafe {
            let init: Symbol<'_, CuInit> = lib.get(b"cuInit\0")?;
            let count: Symbol<'_, CuDeviceGetCount> = lib.get(b"cuDeviceGetCount\0")?;
            let get: Symbol<'_, CuDeviceGet> = lib.get(b"cuDeviceGet\0")?;
            let retain: Symbol<'_, CuPrimaryCtxRetain> = lib.get(b"cuDevicePrimaryCtxRetain\0")?;
            let _: Symbol<'_, CuPrimaryCtxRelease> = lib.get(b"cuDevicePrimaryCtxRelease_v2\0")?;
            check("cuInit", init(0))?;
            let mut n = 0;
            check("cuDeviceGetCount", count(&raw mut n))?;
            for ordinal in 0..n {
                let mut dev = 0;
                check("cuDeviceGet", get(&raw mut dev, ordinal))?;
                let mut ctx = std::ptr::null_mut();
                check("cuDevicePrimaryCtxRetain", retain(&raw mut ctx, dev))?;
                devices.push(dev);
            }
        }
        Ok(HeldContexts { lib, devices })
    }

    /// How many GPUs are kept warm.
    #[must_use]
    pub fn count(&self) -> usize {
        self.devices.len()
    }
}

impl Drop for HeldContexts {
    fn drop(&mut self) {
        // SAFETY: the symbol was resolved in `hold` with this signature; each device had its
        // primary context retained once there.
        unsafe {
            if let Ok(release) = self
                .lib
                .get::<CuPrimaryCtxRelease>(b"cuDevicePrimaryCtxRelease_v2\0")
            {
                for &d in &self.devices {
                    release(d);
                }
            }
        }
    }
}
