use std::path::Path;

use super::*;
use crate::nvidia::edits::{Library, Symlink};
use serde_json::json;

#[test]
fn symlinks_stay_inside_the_rootfs() {
    let root = tempfile::tempdir().unwrap();
    let e = ContainerEdits {
        symlinks: vec![Symlink {
            link: "/usr/lib/libcuda.so".into(),
            target: "libcuda.so.1".into(),
        }],
        ..ContainerEdits::default()
    };
    assert_eq!(
        make_symlinks(&Root::open(root.path()).unwrap(), &e).unwrap(),
        1
    );
    assert_eq!(
        std::fs::read_link(root.path().join("usr/lib/libcuda.so")).unwrap(),
        Path::new("libcuda.so.1")
    );
    assert_eq!(
        make_symlinks(&Root::open(root.path()).unwrap(), &e).unwrap(),
        0,
        "existing links are kept"
    );
    let bad = ContainerEdits {
        symlinks: vec![Symlink {
            link: "/../../etc/x".into(),
            target: "y".into(),
        }],
        ..ContainerEdits::default()
    };
    assert!(
        make_symlinks(&Root::open(root.path()).unwrap(), &bad)
            .unwrap_err()
            .to_string()
            .contains("..")
    );
}

fn cache_of(keys: &[&str]) -> Vec<u8> {
    let entries: Vec<ldcache::Entry<'_>> = keys
        .iter()
        .map(|k| ldcache::Entry {
            flags: 0x0303,
            key: (*k).into(),
            value: format!("/usr/lib/{k}").into(),
            osversion: 0,
            hwcap: 0,
        })
        .collect();
    ldcache::write(&entries)
}

fn cuda_edits() -> ContainerEdits {
    ContainerEdits {
        libraries: vec![Library {
            soname: "libcuda.so.1".into(),
            path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
        }],
        ..ContainerEdits::default()
    }
}

fn written_keys(root: &Path) -> Vec<String> {
    let d = std::fs::read(root.join("etc/ld.so.cache")).unwrap();
    let mut k: Vec<String> = ldcache::parse(&d)
        .unwrap()
        .into_iter()
        .map(|e| e.key.into_owned())
        .collect();
    k.sort();
    k
}

#[test]
fn the_ld_cache_is_written_into_the_rootfs_merged_with_the_image_cache() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("rootfs");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(
        root.join("etc/ld.so.cache"),
        cache_of(&["libz.so.1", "libc.so.6"]),
    )
    .unwrap();
    let mut spec = json!({});
    let got = install_ld_cache(
        &mut spec,
        &Root::open(&root).unwrap(),
        &cuda_edits(),
        t.path(),
    )
    .unwrap();
    assert_eq!(got, LdCache::Written { image_entries: 2 });
    assert_eq!(
        written_keys(&root),
        ["libc.so.6", "libcuda.so.1", "libz.so.1"]
    );
    assert!(spec.get("mounts").is_none(), "nothing bind-mounted over it");
    let mut none = json!({});
    assert_eq!(
        install_ld_cache(
            &mut none,
            &Root::open(&root).unwrap(),
            &ContainerEdits::default(),
            t.path()
        )
        .unwrap(),
        LdCache::Unchanged
    );
}

#[test]
fn a_hostile_image_cache_is_ignored_and_never_followed_or_blocked_on() {
    let t = tempfile::tempdir().unwrap();
    let host = t.path().join("host.cache");
    std::fs::write(&host, cache_of(&["libhost.so.1"])).unwrap();
    let before = std::fs::read(&host).unwrap();
    for plant in ["fifo", "abs-link", "rel-link", "garbage", "huge"] {
        let root = t.path().join(format!("rootfs-{plant}"));
        std::fs::create_dir_all(root.join("etc")).unwrap();
        let c = root.join("etc/ld.so.cache");
        match plant {
            "fifo" => {
                nix::unistd::mkfifo(&c, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap()
            }
            "abs-link" => std::os::unix::fs::symlink(&host, &c).unwrap(),
            "rel-link" => {
                std::os::unix::fs::symlink(format!("../../../../../../../..{}", host.display()), &c)
                    .unwrap()
            }
            "garbage" => std::fs::write(&c, b"glibc-ld.so.cache1.1\xff\xff\xff\xff").unwrap(),
            _ => {
                let f = std::fs::File::create(&c).unwrap();
                f.set_len(ldcache::MAX_CACHE_BYTES + 1).unwrap();
            }
        }
        let mut spec = json!({});
        let got = install_ld_cache(
            &mut spec,
            &Root::open(&root).unwrap(),
            &cuda_edits(),
            t.path(),
        )
        .unwrap();
        assert_eq!(got, LdCache::Written { image_entries: 0 }, "{plant}");
        assert_eq!(written_keys(&root), ["libcuda.so.1"], "{plant}");
        assert_eq!(
            std::fs::read(&host).unwrap(),
            before,
            "{plant}: host file untouched"
        );
    }
}
