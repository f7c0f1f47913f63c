//! The few facts the shim reads from ELF shared objects, with a bounded parser (every offset
//! checked, every loop capped): a library's `DT_SONAME`, the newest glibc symbol version a C
//! library defines, and the newest one a library needs.
//!
//! Why the glibc versions: the CUDA interposer is preloaded into every process of a GPU
//! container, so it must not need a glibc symbol version newer than the image's C library has
//! — the program would not start at all. The shim reads both sides at Create and injects the
//! interposer only where they fit (`uvm::inject`). Inputs come from images (hostile) and from
//! the host's driver files; nothing here trusts a count or an offset.
//!
//! 64-bit little-endian ELF only (x86-64, aarch64); anything else is "unknown".

/// `(major, minor)` of a `GLIBC_x.y` version.
pub type GlibcVersion = (u32, u32);

/// The most dynamic entries, program headers or version records looked at.
const MAX_RECORDS: usize = 4096;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;
const DT_SONAME: u64 = 14;
const DT_VERDEF: u64 = 0x6fff_fffc;
const DT_VERDEFNUM: u64 = 0x6fff_fffd;
const DT_VERNEED: u64 = 0x6fff_fffe;
const DT_VERNEEDNUM: u64 = 0x6fff_ffff;

fn u16_at(d: &[u8], off: usize) -> Option<u16> {
    d.get(off..off.checked_add(2)?)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
}

fn u32_at(d: &[u8], off: usize) -> Option<u32> {
    d.get(off..off.checked_add(4)?)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn u64_at(d: &[u8], off: usize) -> Option<u64> {
    let b = d.get(off..off.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Some(u64::from_le_bytes(a))
}

fn cstr_at(d: &[u8], off: usize) -> Option<&str> {
    let rest = d.get(off..)?;
    let rest = &rest[..rest.len().min(4096)];
    let end = rest.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&rest[..end]).ok()
}

/// What the dynamic segment says, with virtual addresses mapped to file offsets.
#[derive(Debug, Default)]
struct Dynamic {
    strtab: Option<usize>,
    strsz: usize,
    soname: Option<u64>,
    verdef: Option<usize>,
    verdefnum: usize,
    verneed: Option<usize>,
    verneednum: usize,
}

fn dynamic(d: &[u8]) -> Option<Dynamic> {
    if d.get(0..4)? != b"\x7fELF" || *d.get(4)? != 2 || *d.get(5)? != 1 {
        return None;
    }
    let phoff = usize::try_from(u64_at(d, 0x20)?).ok()?;
    let phentsize = usize::from(u16_at(d, 0x36)?);
    let phnum = usize::from(u16_at(d, 0x38)?).min(MAX_RECORDS);
    if phentsize < 56 {
        return None;
    }
    let mut loads = Vec::new();
    let mut dyn_seg = None;
    for i in 0..phnum {
        let p = phoff.checked_add(i.checked_mul(phentsize)?)?;
        let kind = u32_at(d, p)?;
        let offset = u64_at(d, p.checked_add(8)?)?;
        let vaddr = u64_at(d, p.checked_add(16)?)?;
        let filesz = u64_at(d, p.checked_add(32)?)?;
        match kind {
            PT_LOAD => loads.push((vaddr, offset, filesz)),
            PT_DYNAMIC => dyn_seg = Some((offset, filesz)),
            _ => {}
        }
    }
    let to_file = |addr: u64| -> Option<usize> {
        let (v, o, _) = loads
            .iter()
            .find(|(v, _, sz)| addr >= *v && addr - *v < *sz)?;
        usize::try_from((addr - v).checked_add(*o)?).ok()
    };
    let (dyn_off, dyn_size) = dyn_seg?;
    let mut at = usize::try_from(dyn_off).ok()?;
    let end = at.checked_add(usize::try_from(dyn_size).ok()?)?;
    let mut out = Dynamic::default();
    for _ in 0..MAX_RECORDS {
        if at.checked_add(16)? > end {
            break;
        }
        let tag = u64_at(d, at)?;
        let val = u64_at(d, at + 8)?;
        match tag {
            DT_NULL => break,
            DT_STRTAB => out.strtab = to_file(val),
            DT_STRSZ => out.strsz = usize::try_from(val).unwrap_or(usize::MAX),
            DT_SONAME => out.soname = Some(val),
            DT_VERDEF => out.verdef = to_file(val),
            DT_VERDEFNUM => out.verdefnum = usize::try_from(val).unwrap_or(0).min(MAX_RECORDS),
            DT_VERNEED => out.verneed = to_file(val),
            DT_VERNEEDNUM => {
                out.verneednum = usize::try_from(val).unwrap_or(0).min(MAX_RECORDS);
            }
            _ => {}
        }
        at += 16;
    }
    Some(out)
}

impl Dynamic {
    fn string<'a>(&self, d: &'a [u8], off: u64) -> Option<&'a str> {
        let off = usize::try_from(off).ok()?;
        if self.strsz != 0 && off >= self.strsz {
            return None;
        }
        cstr_at(d, self.strtab?.checked_add(off)?)
    }
}

/// The `DT_SONAME` of a shared library.
#[must_use]
pub fn soname(d: &[u8]) -> Option<String> {
    let dy = dynamic(d)?;
    dy.string(d, dy.soname?).map(str::to_owned)
}

/// `GLIBC_2.34` → `(2, 34)`.
#[must_use]
pub fn parse_glibc(name: &str) -> Option<GlibcVersion> {
    let (major, minor) = name.strip_prefix("GLIBC_")?.split_once('.')?;
    let minor = minor.split('.').next()?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The newest `GLIBC_x.y` version a C library defines (its `DT_VERDEF`): what the image's
/// `libc.so.6` can satisfy. `None` for anything that is not a glibc (musl defines none).
#[must_use]
pub fn glibc_defined(d: &[u8]) -> Option<GlibcVersion> {
    let dy = dynamic(d)?;
    let mut at = dy.verdef?;
    let mut best = None;
    for _ in 0..dy.verdefnum {
        // Elf64_Verdef: version, flags, ndx, cnt (u16 each), hash, aux, next (u32 each).
        let aux = u32_at(d, at.checked_add(12)?)? as usize;
        let next = u32_at(d, at.checked_add(16)?)? as usize;
        let name = u32_at(d, at.checked_add(aux)?)?;
        if let Some(v) = dy.string(d, u64::from(name)).and_then(parse_glibc) {
            best = best.max(Some(v));
        }
        if next == 0 {
            break;
        }
        at = at.checked_add(next)?;
    }
    best
}

/// The newest `GLIBC_x.y` version a shared object needs from the C library (its `DT_VERNEED`):
/// the oldest glibc it loads on. `Some((0, 0))` for an object that needs no glibc version.
#[must_use]
pub fn glibc_needed(d: &[u8]) -> Option<GlibcVersion> {
    let dy = dynamic(d)?;
    let Some(mut at) = dy.verneed else {
        return Some((0, 0));
    };
    let mut best = (0, 0);
    let mut seen = 0;
    for _ in 0..dy.verneednum {
        // Elf64_Verneed: version, cnt (u16), file, aux, next (u32).
        let cnt = usize::from(u16_at(d, at.checked_add(2)?)?);
        let aux = u32_at(d, at.checked_add(8)?)? as usize;
        let next = u32_at(d, at.checked_add(12)?)? as usize;
        let mut a = at.checked_add(aux)?;
        for _ in 0..cnt {
            seen += 1;
            if seen > MAX_RECORDS {
                return None;
            }
            // Elf64_Vernaux: hash (u32), flags, other (u16), name, next (u32).
            let name = u32_at(d, a.checked_add(8)?)?;
            let anext = u32_at(d, a.checked_add(12)?)? as usize;
            if let Some(v) = dy.string(d, u64::from(name)).and_then(parse_glibc) {
                best = best.max(v);
            }
            if anext == 0 {
                break;
            }
            a = a.checked_add(anext)?;
        }
        if next == 0 {
            break;
        }
        at = at.checked_add(next)?;
    }
    Some(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_libc() -> Option<Vec<u8>> {
        [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/aarch64-linux-gnu/libc.so.6",
            "/lib64/libc.so.6",
        ]
        .iter()
        .find_map(|p| std::fs::read(p).ok())
    }

    #[test]
    fn reads_the_host_c_library_and_itself() {
        let Some(libc) = host_libc() else { return };
        assert_eq!(soname(&libc).as_deref(), Some("libc.so.6"));
        let defined = glibc_defined(&libc).expect("glibc defines versions");
        assert!(defined >= (2, 17), "{defined:?}");
        // libc needs versions of the loader, never newer than it defines itself.
        let needed = glibc_needed(&libc).unwrap();
        assert!(needed <= defined, "{needed:?} > {defined:?}");
        // The test binary itself is linked against this glibc.
        let me = std::fs::read("/proc/self/exe").unwrap();
        assert_eq!(glibc_defined(&me), None);
    }

    #[test]
    fn names_and_garbage() {
        assert_eq!(parse_glibc("GLIBC_2.34"), Some((2, 34)));
        assert_eq!(parse_glibc("GLIBC_2.2.5"), Some((2, 2)));
        assert_eq!(parse_glibc("GLIBC_PRIVATE"), None);
        assert_eq!(parse_glibc("GCC_3.0"), None);
        for bad in [&b""[..], b"\x7fELF", b"\x7fELF\x01\x01", &[0xffu8; 200]] {
            assert_eq!(soname(bad), None);
            assert_eq!(glibc_defined(bad), None);
            assert_eq!(glibc_needed(bad), None);
        }
        // Every truncation of a real library parses or fails, never panics.
        if let Some(libc) = host_libc() {
            for cut in (0..libc.len()).step_by(libc.len() / 97 + 1) {
                let _ = (
                    soname(&libc[..cut]),
                    glibc_defined(&libc[..cut]),
                    glibc_needed(&libc[..cut]),
                );
            }
        }
    }
}
