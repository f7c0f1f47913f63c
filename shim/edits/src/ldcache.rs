//! glibc's `ld.so.cache`: reading it, and writing one for a container — the image's own entries
//! plus the driver libraries mounted into it — so the dynamic loader finds `libcuda.so.1` wherever
//! the host keeps it, without running `ldconfig` in the container on every create.
//!
//! Format ("glibc-ld.so.cache1.1", new format only): a 48-byte header, 24-byte entries sorted as
//! glibc's binary search expects (names in reverse `_dl_cache_libcmp` order — digit runs compared
//! as numbers — then flags descending), then the strings; string offsets count from the header.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::HashMap;

const MAGIC: &[u8] = b"glibc-ld.so.cache";
const VERSION: &[u8] = b"1.1";
const HEADER: usize = 48;
const ENTRY: usize = 24;
/// `FLAG_ELF_LIBC6`.
const ELF_LIBC6: i32 = 0x0003;

/// The largest cache the shim reads (an image's, or the host's): real ones are tens to hundreds
/// of kilobytes.
pub const MAX_CACHE_BYTES: u64 = 16 << 20;
/// The longest path an entry may have (`PATH_MAX`).
pub const MAX_STRING: usize = 4096;
/// The longest key (a soname) an entry may have: real ones are a few dozen bytes, and keys are
/// what sorting compares.
pub const MAX_KEY: usize = 256;
/// The most entries a cache may have: a full distribution has a few thousand. Bounds the work
/// (parsing, sorting, writing) a crafted cache can cost, not only its memory.
pub const MAX_ENTRIES: usize = 20_000;

/// One cache entry. Parsed entries borrow their strings from the cache bytes: a cache whose
/// entries all point at one long string costs no copy per entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Type and architecture flags (`FLAG_ELF_LIBC6 | FLAG_X8664_LIB64` = 0x0303 on x86-64).
    pub flags: i32,
    /// The soname looked up (`libcuda.so.1`).
    pub key: Cow<'a, str>,
    /// The path the loader opens.
    pub value: Cow<'a, str>,
    /// Minimum OS version (0).
    pub osversion: u32,
    /// Hardware capabilities (0).
    pub hwcap: u64,
}

fn u32_at(d: &[u8], off: usize) -> Option<u32> {
    d.get(off..off.checked_add(4)?)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn u64_at(d: &[u8], off: usize) -> Option<u64> {
    let lo = u64::from(u32_at(d, off)?);
    let hi = u64::from(u32_at(d, off.checked_add(4)?)?);
    Some(lo | (hi << 32))
}

/// A NUL-terminated UTF-8 string of at most `max` bytes starting at `off`.
fn str_at(d: &[u8], off: usize, max: usize) -> Option<&str> {
    let rest = d.get(off..)?;
    let window = &rest[..rest.len().min(max + 1)];
    let end = window.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&window[..end]).ok()
}

/// Parses a cache (new format, alone or after the old "ld.so-1.7.0" table). Bounded: at most
/// [`MAX_ENTRIES`] entries, the entry table must fit in the data, every string offset must point
/// inside it, keys are at most [`MAX_KEY`] bytes and paths [`MAX_STRING`], each distinct string
/// is read once, and nothing is copied.
///
/// # Errors
/// Not a glibc cache, truncated, or an entry pointing outside the data.
pub fn parse(d: &[u8]) -> Result<Vec<Entry<'_>>, String> {
    let full: Vec<u8> = [MAGIC, VERSION].concat();
    let start = d
        .windows(full.len())
        .position(|w| w == full.as_slice())
        .ok_or("no glibc-ld.so.cache1.1 header")?;
    let h = &d[start..];
    let nlibs = u32_at(h, 20).ok_or("truncated header")? as usize;
    if nlibs > MAX_ENTRIES {
        return Err(format!(
            "{nlibs} entries announced, more than the {MAX_ENTRIES} accepted"
        ));
    }
    let table = nlibs
        .checked_mul(ENTRY)
        .and_then(|t| t.checked_add(HEADER))
        .ok_or("entry count overflows")?;
    if h.len() < table {
        return Err(format!("truncated: {nlibs} entries announced"));
    }
    let mut out = Vec::with_capacity(nlibs);
    // Entries sharing a string read it once.
    let mut seen: HashMap<(usize, usize), Option<&str>> = HashMap::new();
    let mut string = |off: usize, max: usize| {
        *seen
            .entry((off, max))
            .or_insert_with(|| str_at(h, off, max))
    };
    for i in 0..nlibs {
        let e = HEADER + i * ENTRY;
        let flags = u32_at(h, e).ok_or("truncated entry")?.cast_signed();
        let key = u32_at(h, e + 4).ok_or("truncated entry")? as usize;
        let value = u32_at(h, e + 8).ok_or("truncated entry")? as usize;
        let osversion = u32_at(h, e + 12).ok_or("truncated entry")?;
        let hwcap = u64_at(h, e + 16).ok_or("truncated entry")?;
        let (Some(key), Some(value)) = (string(key, MAX_KEY), string(value, MAX_STRING)) else {
            return Err(format!(
                "entry {i}: string offset out of range, not UTF-8, or too long (keys {MAX_KEY}, paths {MAX_STRING})"
            ));
        };
        out.push(Entry {
            flags,
            key: Cow::Borrowed(key),
            value: Cow::Borrowed(value),
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

/// Serializes entries in the order glibc's lookup needs. Each distinct string is written once
/// (entries share it, as `ldconfig`'s own caches do), so the output is never larger than the
/// entry table plus the distinct strings it was given.
#[must_use]
pub fn write<'a>(entries: &'a [Entry<'a>]) -> Vec<u8> {
    let mut sorted: Vec<&'a Entry<'a>> = entries.iter().collect();
    sorted.sort_by(|x, y| {
        libcmp(&y.key, &x.key)
            .then(y.flags.cmp(&x.flags))
            .then(y.hwcap.cmp(&x.hwcap))
    });
    let strings_at = HEADER + sorted.len() * ENTRY;
    let mut strings: Vec<u8> = Vec::new();
    let mut seen: HashMap<&str, u32> = HashMap::new();
    let mut table = Vec::with_capacity(sorted.len() * ENTRY);
    for e in &sorted {
        let mut offset = |s: &'a str| -> u32 {
            *seen.entry(s).or_insert_with(|| {
                let o = strings_at + strings.len();
                strings.extend_from_slice(s.as_bytes());
                strings.push(0);
                u32::try_from(o).unwrap_or(u32::MAX)
            })
        };
        let k = offset(&e.key);
        let v = offset(&e.value);
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
fn abi_flags(image: &[Entry<'_>]) -> i32 {
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

/// A cache for a container: the image's entries (when its cache parsed) with the driver
/// libraries `(soname, container path)` added, replacing any image entry of the same name.
#[must_use]
pub fn for_container(image: &[Entry<'_>], driver: &[(String, String)]) -> Vec<u8> {
    let flags = abi_flags(image);
    let mut entries: Vec<Entry<'_>> = image
        .iter()
        .filter(|e| !driver.iter().any(|(k, _)| *k == e.key))
        .cloned()
        .collect();
    for (k, v) in driver {
        entries.push(Entry {
            flags,
            key: Cow::Borrowed(k),
            value: Cow::Borrowed(v),
            osversion: 0,
            hwcap: 0,
        });
    }
    write(&entries)
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

    fn e(k: &str) -> Entry<'static> {
        Entry {
            flags: 0x0303,
            key: Cow::Owned(k.into()),
            value: Cow::Owned(format!("/lib/{k}")),
            osversion: 0,
            hwcap: 0,
        }
    }

    #[test]
    fn written_caches_parse_back_sorted() {
        let bytes = write(&[
            e("liba.so.1"),
            e("libc.so.6"),
            e("libz.so.1"),
            e("libc.so.10"),
        ]);
        let back = parse(&bytes).unwrap();
        let keys: Vec<&str> = back.iter().map(|x| x.key.as_ref()).collect();
        assert_eq!(keys, ["libz.so.1", "libc.so.10", "libc.so.6", "liba.so.1"]);
        assert_eq!(back[0].value, "/lib/libz.so.1");
        assert!(parse(&bytes[..60]).unwrap_err().contains("truncated"));
        // Driver entries replace the image's of the same name and take its ABI flags.
        let mut img = e("libcuda.so.1");
        img.value = "/old/libcuda.so.1".into();
        let mut libc = e("libc.so.6");
        libc.flags = 0x0a03;
        let image = write(&[img, libc]);
        let merged = for_container(
            &parse(&image).unwrap(),
            &[("libcuda.so.1".into(), "/opt/nv/libcuda.so.1".into())],
        );
        let m = parse(&merged).unwrap();
        assert_eq!(m.len(), 2);
        let cuda = m.iter().find(|x| x.key == "libcuda.so.1").unwrap();
        assert_eq!(
            (cuda.value.as_ref(), cuda.flags),
            ("/opt/nv/libcuda.so.1", 0x0a03)
        );
    }

    /// A crafted cache: `n` entries whose key and value all point at one string of `len` bytes.
    fn shared_string_cache(n: u32, len: usize) -> Vec<u8> {
        let strings_at = HEADER + n as usize * ENTRY;
        let mut d = Vec::new();
        d.extend_from_slice(MAGIC);
        d.extend_from_slice(VERSION);
        d.extend_from_slice(&n.to_le_bytes());
        d.extend_from_slice(&u32::try_from(len + 1).unwrap().to_le_bytes());
        d.extend_from_slice(&[2, 0, 0, 0]);
        d.extend_from_slice(&[0u8; 16]);
        let off = u32::try_from(strings_at).unwrap();
        for _ in 0..n {
            d.extend_from_slice(&0x0303i32.to_le_bytes());
            d.extend_from_slice(&off.to_le_bytes());
            d.extend_from_slice(&off.to_le_bytes());
            d.extend_from_slice(&[0u8; 12]);
        }
        d.extend(std::iter::repeat_n(b'l', len));
        d.push(0);
        d
    }

    #[test]
    fn a_cache_sharing_one_string_costs_no_more_than_its_size() {
        // 6 000 entries × a 256-byte key: ~150 KB of input, ~1.5 MB once copied per entry (the
        // issue's crafted cache, with longer strings, reached ~400 MB).
        let d = shared_string_cache(6000, MAX_KEY);
        assert!(d.len() < 160_000);
        let entries = parse(&d).unwrap();
        assert_eq!(entries.len(), 6000);
        assert!(entries.iter().all(|e| matches!(e.key, Cow::Borrowed(_))));
        let out = for_container(
            &entries,
            &[("libcuda.so.1".into(), "/x/libcuda.so.1".into())],
        );
        assert!(
            out.len() < d.len() + 100,
            "written {} from {}",
            out.len(),
            d.len()
        );
        // A key longer than a soname can be, or an offset past the end: refused.
        let long = shared_string_cache(2, MAX_KEY + 1);
        assert!(parse(&long).unwrap_err().contains("too long"));
        let mut past = shared_string_cache(1, 8);
        past[HEADER + 4..HEADER + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        parse(&past).unwrap_err();
        // An announced count whose table cannot fit is refused before anything is allocated, and
        // so is one past the entry cap (it bounds parsing and sorting work too).
        let mut huge = shared_string_cache(1, 8);
        huge[20..24].copy_from_slice(&u32::try_from(MAX_ENTRIES).unwrap().to_le_bytes());
        assert!(parse(&huge).unwrap_err().contains("truncated"));
        let too_many = shared_string_cache(u32::try_from(MAX_ENTRIES).unwrap() + 1, 8);
        assert!(parse(&too_many).unwrap_err().contains("accepted"));
        // The worst a cache within the caps can cost stays small: the most entries, every key of
        // the longest length and sharing a prefix, merged and written.
        let worst = shared_string_cache(u32::try_from(MAX_ENTRIES).unwrap(), MAX_KEY);
        let entries = parse(&worst).unwrap();
        let out = for_container(&entries, &[]);
        assert!(out.len() <= worst.len());
    }
}
