//! The exported `dlsym`, so that handle-scoped lookups of driver functions
//! (`dlsym(dlopen("libcuda.so.1"), "cuMemAlloc_v2")`, as the CUDA runtime makes them) come here
//! too; the real one is fetched with `dlvsym`.
//!
//! Only CUDA lookups may be answered differently than without the interposer. `RTLD_NEXT` is
//! resolved by the C library relative to the object that called `dlsym`, which it finds from the
//! return address: forwarded from here, another preloaded wrapper's `dlsym(RTLD_NEXT, "puts")`
//! would search after *this* library, find that wrapper's own `puts`, and recurse until the
//! stack overflowed. So on x86_64 the exported `dlsym` is a trampoline: an `RTLD_NEXT` lookup
//! jumps straight on to the C library's `dlsym` with the caller's return address still on the
//! stack — resolved exactly as without the interposer (a CUDA wrapper preloaded after this one
//! then reaches the driver directly; the application's own lookups still come here) —, and
//! every other handle goes to [`lookup`]. The real `dlsym` is resolved by a constructor when the
//! library is loaded, or by the trampoline itself if another library's constructor asks first.
//! aarch64 has the same trampoline (the return address is in the link register there, which a
//! plain branch leaves alone); on other architectures `RTLD_NEXT` takes [`lookup`] too.

use std::ffi::{CStr, c_char, c_void};

use crate::real::{self, Fn};
use crate::{GetProcAddressFn, base_name, cuGetProcAddress, guard, ptds, wrapper};

/// `dlsym(3)`: see the module docs.
///
/// # Safety
/// As `dlsym(3)`.
#[cfg(all(target_arch = "x86_64", not(feature = "fuzzing")))]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // At each tail jump the stack and the argument registers are as the caller left them: the
    // callee sees the caller's own frame and return address. `rax` is a scratch register in the
    // System V ABI. RTLD_NEXT is ((void *) -1). Before this library's constructor ran (another
    // preloaded library's constructor may run first and look up with RTLD_NEXT), the real dlsym
    // is resolved here: the arguments are saved, the stack aligned to 16 bytes for the call
    // (8 mod 16 at entry, two pushes and 8 more), and all of it undone before the jump.
    core::arch::naked_asm!(
        "cmp rdi, -1",
        "jne 2f",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jnz 3f",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 2f",
        "3:",
        "jmp rax",
        "2:",
        "jmp {ours}",
        real = sym real::DLSYM,
        resolve = sym resolve_dlsym,
        ours = sym lookup,
    )
}

/// `dlsym(3)` on aarch64: see the module docs.
///
/// # Safety
/// As `dlsym(3)`.
#[cfg(all(target_arch = "aarch64", not(feature = "fuzzing")))]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // At each branch `x0`, `x1`, the stack and the link register `x30` (the caller's return
    // address, which the C library's dlsym reads for RTLD_NEXT) are as the caller left them.
    // `x16` is the intra-procedure-call scratch register of the AAPCS64. RTLD_NEXT is
    // ((void *) -1): `cmn x0, #1` sets Z exactly for it. Before this library's constructor ran,
    // the real dlsym is resolved here: the arguments, frame pointer and link register are saved
    // in a 32-byte frame (the stack stays 16-byte aligned), restored before the branch. It
    // begins with a BTI landing pad for calls (`bti c`, a no-op on cores without BTI), should
    // the library ever be built with branch protection.
    core::arch::naked_asm!(
        "hint #34",
        "cmn x0, #1",
        "b.ne 2f",
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "cbnz x16, 3f",
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {resolve}",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "cbz x16, 2f",
        "3:",
        "br x16",
        "2:",
        "b {ours}",
        real = sym real::DLSYM,
        resolve = sym resolve_dlsym,
        ours = sym lookup,
    )
}

/// `dlsym(3)` where no trampoline is built (other architectures; the fuzzing build, which
/// exports nothing).
///
/// # Safety
/// As `dlsym(3)`.
#[cfg(not(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    not(feature = "fuzzing")
)))]
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // SAFETY: the caller's arguments, as dlsym(3) takes them.
    unsafe { lookup(handle, symbol) }
}

/// Resolves the real `dlsym` when the library is loaded, before the application runs.
#[cfg(not(feature = "fuzzing"))]
#[used]
#[unsafe(link_section = ".init_array")]
static RESOLVE_DLSYM: extern "C" fn() = resolve_dlsym;

/// Resolves the real `dlsym` (the constructor, and the trampoline before it ran). Never
/// unwinds: a panic is caught here, inside the library.
#[cfg(not(feature = "fuzzing"))]
extern "C" fn resolve_dlsym() {
    guard((), || {
        let _ = real::dlsym();
    });
}

/// What the exported `dlsym` answers for every handle but `RTLD_NEXT` (see the module docs):
/// the real lookup, with the wrapper substituted for a driver function this library wraps.
///
/// # Safety
/// As `dlsym(3)`.
pub unsafe extern "C" fn lookup(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let Some(real_dlsym) = real::dlsym() else {
            return std::ptr::null_mut();
        };
        // SAFETY: forwarding the caller's arguments to the real dlsym.
        let found = unsafe { real_dlsym(handle, symbol) };
        if found.is_null() || symbol.is_null() {
            return found;
        }
        // SAFETY: dlsym's symbol is a NUL-terminated string (it just resolved).
        let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
        if name == b"cuGetProcAddress" {
            real::remember(Fn::GetProcAddress, found);
            return cuGetProcAddress as GetProcAddressFn as *mut c_void;
        }
        if !name.starts_with(b"cu") {
            return found;
        }
        // IPC has no 32-bit ABI: its name before CUDA 11 is the same call, counted too.
        if name == b"cuIpcOpenMemHandle" {
            return crate::share::ipc_open_v1(found);
        }
        // A per-thread default stream variant (`cuLaunchKernel_ptsz`) has its own wrapper.
        let (plain, per_thread) = ptds::split(name);
        let found_wrapper = wrapper(base_name(plain)).and_then(|w| {
            if per_thread {
                ptds::per_thread(w.0)
            } else {
                Some(w)
            }
        });
        match found_wrapper {
            // Only the exact symbol a wrapper forwards to: the unversioned names of `_v2`
            // functions (`cuMemAlloc`) are the CUDA 3.1 ABI (32-bit sizes), never substituted.
            Some((which, ours)) if which.symbol().to_bytes() == name => {
                // A driver whose own table points at the exported name hands back this library's
                // function: never take that for the real one (it would call itself).
                if found != ours {
                    real::remember(which, found);
                }
                ours
            }
            Some(_) | None => found,
        }
    })
}
