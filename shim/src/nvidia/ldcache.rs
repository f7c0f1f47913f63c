//! glibc's `ld.so.cache`: reading it, and writing one for a container — the image's own entries
//! plus the driver libraries mounted into it — so the dynamic loader finds `libcuda.so.1` wherever
//! the host keeps it, without running `ldconfig` in the container on every create.
//!
//! Format ("glibc-ld.so.cache1.1", new format only): a 48-byte header, 24-byte entries sorted as
//! glibc's binary search expects (names in reverse `_dl_cache_libcmp` order — digit runs compared
//! as numbers — then flags descending), then the strings; string offsets count from the header.

use std::cmp::Ordering;
use std::path::Path;

const MAGIC: &[u8] = b"glibc-ld.so.cache";
const VERSION: &[u8] = b"1.1";
const HEADER: usize = 48;
const ENTRY: usize = 24;
/// `FLAG_ELF_LIBC6`.
const ELF_LIBC6: i32 = 0x0003;

/// One cache entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Type and architecture flags (`FLAG_ELF_LIBC6 | FLAG_X8664_LIB64` = 0x0303 on x86-64).
    pub flags: i32,
    /// The soname looked up (`libcuda.so.1`).
    pub key: String,
    /// The path the loader opens.
    pub value: String,
    /// Minimum OS version (0).
    pub osversion: u32,
    /// Hardware capabilities (0).
    pub hwcap: u64,
}

fn u32_at(d: &[u8], off: usize) -> Option<u32> {
    d.get(off..off + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn u64_at(d: &[u8], off: usize) -> Option<u64> {
    let lo = u64::from(u32_at(d, off)?);
    let hi = u64::from(u32_at(d, off + 4)?);
    Some(lo | (hi << 32))
}

fn cstr_at(d: &[u8], off: usize) -> Option<String> {
    let rest = d.get(off..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    String::from_utf8(rest[..end].to_vec()).ok()
}

/// Parses a cache (new format, alone or after the old "ld.so-1.7.0" table).
///
/// # Errors
/// Not a glibc cache, or truncated.
pub fn parse(d: &[u8]) -> Result<Vec<Entry>, String> {
    let full: Vec<u8> = [MAGIC, VERSION].concat();
    let start = d
        .windows(full.len())
        .position(|w| w == full.as_slice())
        .ok_or("no glibc-ld.so.cache1.1 header")?;
    let h = &d[start..];
    let nlibs = u32_at(h, 20).ok_or("truncated header")? as usize;
    if h.len() < HEADER + nlibs.saturating_mul(ENTRY) {
        return Err(format!("truncated: {nlibs} entries announced"));
    }
    let mut out = Vec::with_capacity(nlibs);
    for i in 0..nlibs {
        let e = HEADER + i * ENTRY;
        let flags = u32_at(h, e).ok_or("truncated entry")? as i32;
        let key = u32_at(h, e + 4).ok_or("truncated entry")? as usize;
        let value = u32_at(h, e + 8).ok_or("truncated entry")? as usize;
        let osversion = u32_at(h, e + 12).ok_or("truncated entry")?;
        let hwcap = u64_at(h, e + 16).ok_or("truncated entry")?;
        let (Some(key), Some(value)) = (cstr_at(h, key), cstr_at(h, value)) else {
            return Err(format!("entry {i}: string offset out of range"));
        };
        out.push(Entry {
            flags,
            key,
            value,
            osversion,
            hwcap,
        });
    }
    Ok(out)
}

/// glibc's `_dl_cache_libcmp`: bytewise, except that runs of digits compare as numbers and a
/// digit sorts after a non-digit.
#[must_use]
pub fn libcmp(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < a.len() {
        if a[i].is_ascii_digit() {
            if j < b.len() && b[j].is_ascii_digit() {
                let (mut x, mut y) = (0u64, 0u64);
                while i < a.len() && a[i].is_ascii_digit() {
                    x = x.saturating_mul(10).saturating_add(u64::from(a[i] - b'0'));
                    i += 1;
                }
                while j < b.len() && b[j].is_ascii_digit() {
                    y = y.saturating_mul(10).saturating_add(u64::from(b[j] - b'0'));
                    j += 1;
                }
                if x != y {
                    return x.cmp(&y);
                }
            } else {
                return Ordering::Greater;
            }
        } else if j < b.len() && b[j].is_ascii_digit() {
            return Ordering::Less;
        } else if j >= b.len() || a[i] != b[j] {
            return a[i].cmp(b.get(j).unwrap_or(&0));
        } else {
            i += 1;
            j += 1;
        }
    }
    if j < b.len() {
        Ordering::Less
    } else {
        Ordering::Equal
    }
}

/// Serializes entries in the order glibc's lookup needs.
#[must_use]
pub fn write(entries: &[Entry]) -> Vec<u8> {
    let mut sorted = entries.to_vec();
    sorted.sort_by(|x, y| {
        libcmp(&y.key, &x.key)
            .then(y.flags.cmp(&x.flags))
            .then(y.hwcap.cmp(&x.hwcap))
    });
    let strings_at = HEADER + sorted.len() * ENTRY;
    let mut strings: Vec<u8> = Vec::new();
    let offset = |s: &str, strings: &mut Vec<u8>| -> u32 {
        let o = strings_at + strings.len();
        strings.extend_from_slice(s.as_bytes());
        strings.push(0);
        u32::try_from(o).unwrap_or(u32::MAX)
    };
    let mut table = Vec::with_capacity(sorted.len() * ENTRY);
    for e in &sorted {
        let k = offset(&e.key, &mut strings);
        let v = offset(&e.value, &mut strings);
        table.extend_from_slice(&e.flags.to_le_bytes());
        table.extend_from_slice(&k.to_le_bytes());
        table.extend_from_slice(&v.to_le_bytes());
        table.extend_from_slice(&e.osversion.to_le_bytes());
        table.extend_from_slice(&e.hwcap.to_le_bytes());
    }
    let mut out = Vec::with_capacity(strings_at + strings.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(VERSION);
    out.extend_from_slice(
        &u32::try_from(sorted.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    out.extend_from_slice(
        &u32::try_from(strings.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    // Flags: little-endian (cache_file_new_flags_endian_little), then padding.
    out.extend_from_slice(&[2, 0, 0, 0]);
    // No extension section; three unused words.
    out.extend_from_slice(&[0u8; 16]);
    out.extend_from_slice(&table);
    out.extend_from_slice(&strings);
    out
}

/// The flags a library of this machine's ABI carries, taken from the image's own `libc.so.6`
/// entry when it has one.
fn abi_flags(image: &[Entry]) -> i32 {
    if let Some(e) = image.iter().find(|e| e.key == "libc.so.6") {
        return e.flags;
    }
    if cfg!(target_arch = "x86_64") {
        ELF_LIBC6 | 0x0300
    } else if cfg!(target_arch = "aarch64") {
        ELF_LIBC6 | 0x0a00
    } else {
        ELF_LIBC6
    }
}

/// A cache for a container: the image's entries (if it has a readable cache) with the driver
/// libraries `(soname, container path)` added, replacing any image entry of the same name.
#[must_use]
pub fn for_container(image_cache: Option<&[u8]>, driver: &[(String, String)]) -> Vec<u8> {
    let mut entries = image_cache.and_then(|d| parse(d).ok()).unwrap_or_default();
    let flags = abi_flags(&entries);
    entries.retain(|e| !driver.iter().any(|(k, _)| *k == e.key));
    for (k, v) in driver {
        entries.push(Entry {
            flags,
            key: k.clone(),
            value: v.clone(),
            osversion: 0,
            hwcap: 0,
        });
    }
    write(&entries)
}

/// The `DT_SONAME` of a 64-bit little-endian ELF shared library, read from its dynamic segment.
#[must_use]
pub fn soname(path: &Path) -> Option<String> {
    let d = std::fs::read(path).ok()?;
    if d.get(0..4)? != b"\x7fELF" || *d.get(4)? != 2 || *d.get(5)? != 1 {
        return None;
    }
    let phoff = usize::try_from(u64_at(&d, 0x20)?).ok()?;
    let phentsize = usize::from(u16::from_le_bytes([*d.get(0x36)?, *d.get(0x37)?]));
    let phnum = usize::from(u16::from_le_bytes([*d.get(0x38)?, *d.get(0x39)?]));
    let mut loads = Vec::new();
    let mut dynamic = None;
    for i in 0..phnum {
        let p = phoff + i * phentsize;
        let kind = u32_at(&d, p)?;
        let offset = u64_at(&d, p + 8)?;
        let vaddr = u64_at(&d, p + 16)?;
        let filesz = u64_at(&d, p + 32)?;
        match kind {
            1 => loads.push((vaddr, offset, filesz)),
            2 => dynamic = Some((offset, filesz)),
            _ => {}
        }
    }
    let (dyn_off, dyn_size) = dynamic?;
    let (mut strtab, mut soname) = (None, None);
    let mut at = usize::try_from(dyn_off).ok()?;
    let end = at + usize::try_from(dyn_size).ok()?;
    while at + 16 <= end {
        let tag = u64_at(&d, at)?;
        let val = u64_at(&d, at + 8)?;
        match tag {
            0 => break,
            5 => strtab = Some(val),
            14 => soname = Some(val),
            _ => {}
        }
        at += 16;
    }
    let strtab = strtab?;
    // DT_STRTAB is a virtual address: map it through the load segments.
    let (vaddr, offset, _) = loads
        .iter()
        .find(|(v, _, sz)| strtab >= *v && strtab < v + sz)?;
    let file_off = usize::try_from(strtab - vaddr + offset + soname?).ok()?;
    cstr_at(&d, file_off)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libcmp_compares_digit_runs_as_numbers() {
        assert_eq!(libcmp("libc.so.6", "libc.so.6"), Ordering::Equal);
        assert_eq!(libcmp("libfoo.so.10", "libfoo.so.9"), Ordering::Greater);
        assert_eq!(libcmp("libfoo.so.1", "libfoo.so"), Ordering::Greater);
        assert_eq!(libcmp("libfoo.so", "libfoo.so.1"), Ordering::Less);
        assert_eq!(libcmp("liba.so.1", "libb.so.1"), Ordering::Less);
        // A digit sorts after a letter.
        assert_eq!(libcmp("lib2.so", "libz.so"), Ordering::Greater);
    }

    #[test]
    fn written_caches_parse_back_sorted() {
        let e = |k: &str| Entry {
            flags: 0x0303,
            key: k.into(),
            value: format!("/lib/{k}"),
            osversion: 0,
            hwcap: 0,
        };
        let bytes = write(&[
            e("liba.so.1"),
            e("libc.so.6"),
            e("libz.so.1"),
            e("libc.so.10"),
        ]);
        let back = parse(&bytes).unwrap();
        let keys: Vec<&str> = back.iter().map(|x| x.key.as_str()).collect();
        assert_eq!(keys, ["libz.so.1", "libc.so.10", "libc.so.6", "liba.so.1"]);
        assert_eq!(back[0].value, "/lib/libz.so.1");
        assert!(parse(&bytes[..60]).unwrap_err().contains("truncated"));
        // Driver entries replace the image's of the same name and take its ABI flags.
        let mut img = e("libcuda.so.1");
        img.value = "/old/libcuda.so.1".into();
        let mut libc = e("libc.so.6");
        libc.flags = 0x0a03;
        let merged = for_container(
            Some(&write(&[img, libc])),
            &[("libcuda.so.1".into(), "/opt/nv/libcuda.so.1".into())],
        );
        let m = parse(&merged).unwrap();
        assert_eq!(m.len(), 2);
        let cuda = m.iter().find(|x| x.key == "libcuda.so.1").unwrap();
        assert_eq!(
            (cuda.value.as_str(), cuda.flags),
            ("/opt/nv/libcuda.so.1", 0x0a03)
        );
    }
}
