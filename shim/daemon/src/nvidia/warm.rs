//! Page-cache warming: reading the driver libraries (and any configured large libraries) once,
//! so the first GPU container after a boot or a cache drop does not pay for disk reads. Files
//! are read in order until the byte budget is spent; directories are walked.

use std::io::Read;
use std::path::{Path, PathBuf};

/// What a warming pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Warmed {
    /// Files read whole.
    pub files: usize,
    /// Bytes read.
    pub bytes: u64,
    /// Files left out (budget spent or unreadable).
    pub skipped: usize,
}

fn walk(p: &Path, out: &mut Vec<PathBuf>) {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
                .unwrap_or_default();
            entries.sort();
            for e in entries {
                walk(&e, out);
            }
        }
        Ok(m) if m.is_file() => out.push(p.to_owned()),
        _ => {}
    }
}

/// Reads `paths` (files, or directories walked) into the page cache, at most `budget` bytes;
/// a file that does not fit in what is left is skipped whole.
#[must_use]
pub fn warm(paths: &[PathBuf], budget: u64) -> Warmed {
    let mut files = Vec::new();
    for p in paths {
        walk(p, &mut files);
    }
    let mut w = Warmed::default();
    let mut buf = vec![0u8; 1 << 20];
    for f in files {
        let size = std::fs::metadata(&f).map_or(u64::MAX, |m| m.len());
        if w.bytes.saturating_add(size) > budget {
            w.skipped += 1;
            continue;
        }
        let Ok(mut file) = std::fs::File::open(&f) else {
            w.skipped += 1;
            continue;
        };
        let mut n = 0u64;
        while let Ok(k) = file.read(&mut buf) {
            if k == 0 {
                break;
            }
            n += k as u64;
        }
        w.bytes += n;
        w.files += 1;
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_within_the_budget_and_walks_directories() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), vec![1u8; 1000]).unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/b"), vec![1u8; 3000]).unwrap();
        std::fs::write(d.path().join("sub/c"), vec![1u8; 500]).unwrap();
        let all = warm(&[d.path().to_owned()], 10_000);
        assert_eq!((all.files, all.bytes, all.skipped), (3, 4500, 0));
        // a (1000) fits, sub/b (3000) does not, sub/c (500) still does.
        let some = warm(&[d.path().to_owned()], 2000);
        assert_eq!((some.files, some.bytes, some.skipped), (2, 1500, 1));
        let none = warm(&[d.path().join("missing")], 10);
        assert_eq!(none, Warmed::default());
    }
}
