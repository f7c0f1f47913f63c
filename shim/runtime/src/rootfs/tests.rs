use std::os::unix::fs::symlink;

use proptest::prelude::*;

use super::*;

const BOTH: [Resolver; 2] = [Resolver::Auto, Resolver::Walk];

/// A rootfs inside a temp dir, and a "host" directory beside it that no operation may touch.
fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("rootfs");
    let host = t.path().join("host");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("secret"), "host file").unwrap();
    (t, root, host)
}

fn host_listing(host: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(host)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn symlinks_through_hostile_links_land_inside_the_root() {
    for r in BOTH {
        let (_t, root, host) = setup();
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        // Absolute, relative-escaping and chained links at several levels of the library path.
        symlink(&host, root.join("usr/lib/x86_64-linux-gnu")).unwrap();
        symlink("../../../../../../..", root.join("usr/lib/up")).unwrap();
        symlink(host.to_str().unwrap(), root.join("lib64")).unwrap();
        symlink("usr/lib/up/x", root.join("chain")).unwrap();
        std::fs::create_dir(root.join("x")).unwrap();
        let fs = Root::open_with(&root, r).unwrap();
        // A directory link that dangles inside the root is refused, not followed out of it.
        let e = fs
            .symlink("/usr/lib/x86_64-linux-gnu/libcuda.so", "libcuda.so.1")
            .unwrap_err();
        assert!(e.is_not_found(), "{e}");
        assert_eq!(host_listing(&host), ["secret"]);
        let inside = root.join(host.strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inside).unwrap();
        assert!(
            fs.symlink("/usr/lib/x86_64-linux-gnu/libcuda.so", "libcuda.so.1")
                .unwrap()
        );
        assert!(fs.symlink("/usr/lib/up/escaped", "x").unwrap());
        assert!(fs.symlink("/lib64/ld.so", "y").unwrap());
        assert!(fs.symlink("/chain/deep/link", "z").unwrap());
        assert_eq!(
            host_listing(&host),
            ["secret"],
            "{r:?}: nothing on the host"
        );
        // The absolute link was taken as the container sees it: `<root><host path>`.
        assert_eq!(
            std::fs::read_link(inside.join("libcuda.so")).unwrap(),
            Path::new("libcuda.so.1")
        );
        std::fs::symlink_metadata(root.join("escaped")).unwrap();
        std::fs::symlink_metadata(root.join("x/deep/link")).unwrap();
        // An existing entry is left alone.
        assert!(!fs.symlink("/escaped", "other").unwrap());
        assert_eq!(
            std::fs::read_link(root.join("escaped")).unwrap(),
            Path::new("x")
        );
    }
}

#[test]
fn reads_take_regular_files_only_and_never_block() {
    for r in BOTH {
        let (_t, root, host) = setup();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        nix::unistd::mkfifo(&root.join("etc/fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        std::fs::write(root.join("etc/big"), vec![0u8; 4097]).unwrap();
        std::fs::write(root.join("etc/ok"), b"cache").unwrap();
        symlink(host.join("secret"), root.join("etc/abs")).unwrap();
        symlink("../../../../../../../../etc/passwd", root.join("etc/rel")).unwrap();
        let fs = Root::open_with(&root, r).unwrap();
        let e = fs.read("/etc/fifo", 4096).unwrap_err();
        assert!(
            matches!(e, RootError::NotRegular { kind: "FIFO", .. }),
            "{e}"
        );
        assert!(matches!(
            fs.read("/etc/big", 4096).unwrap_err(),
            RootError::TooLarge { size: 4097, .. }
        ));
        assert!(matches!(
            fs.read("/etc", 4096).unwrap_err(),
            RootError::NotRegular {
                kind: "directory",
                ..
            }
        ));
        assert_eq!(fs.read("/etc/ok", 4096).unwrap().unwrap(), b"cache");
        // Links to host files resolve inside the root, where nothing is.
        assert_eq!(fs.read("/etc/abs", 4096).unwrap(), None);
        assert_eq!(fs.read("/etc/rel", 4096).unwrap(), None);
        assert_eq!(fs.read("/missing/dir/file", 4096).unwrap(), None);
        if unsafe_free_is_root() {
            nix::sys::stat::mknod(
                &root.join("etc/dev"),
                SFlag::S_IFCHR,
                Mode::from_bits_truncate(0o600),
                nix::sys::stat::makedev(1, 3),
            )
            .unwrap();
            assert!(matches!(
                fs.read("/etc/dev", 4096).unwrap_err(),
                RootError::NotRegular {
                    kind: "character device",
                    ..
                }
            ));
        }
    }
}

#[test]
fn atomic_writes_replace_a_planted_symlink_instead_of_following_it() {
    for r in BOTH {
        let (_t, root, host) = setup();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        symlink(host.join("secret"), root.join("etc/ld.so.cache")).unwrap();
        let fs = Root::open_with(&root, r).unwrap();
        fs.write_atomic("/etc/ld.so.cache", b"new", 0o644).unwrap();
        assert_eq!(
            std::fs::read_to_string(host.join("secret")).unwrap(),
            "host file"
        );
        let md = std::fs::symlink_metadata(root.join("etc/ld.so.cache")).unwrap();
        assert!(md.is_file());
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&md.permissions()) & 0o777,
            0o644
        );
        assert_eq!(std::fs::read(root.join("etc/ld.so.cache")).unwrap(), b"new");
        // /etc itself a link to the host: the file goes to the in-root target instead.
        std::fs::remove_dir_all(root.join("etc")).unwrap();
        symlink(&host, root.join("etc")).unwrap();
        // Dangling inside the root: an error, and nothing on the host.
        let e = fs
            .write_atomic("/etc/ld.so.cache", b"x", 0o644)
            .unwrap_err();
        assert!(e.is_not_found(), "{e}");
        assert_eq!(host_listing(&host), ["secret"]);
        let inside = root.join(host.strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inside).unwrap();
        fs.write_atomic("/etc/ld.so.cache", b"x", 0o644).unwrap();
        assert_eq!(host_listing(&host), ["secret"]);
        // No temporary file is left anywhere.
        assert_eq!(host_listing(&inside), ["ld.so.cache"]);
    }
}

#[test]
fn loops_and_bad_paths_are_errors() {
    for r in BOTH {
        let (_t, root, _host) = setup();
        symlink("b", root.join("a")).unwrap();
        symlink("a", root.join("b")).unwrap();
        std::fs::write(root.join("file"), "x").unwrap();
        let fs = Root::open_with(&root, r).unwrap();
        assert_eq!(
            fs.symlink("/a/x", "t").unwrap_err().errno(),
            Some(libc::ELOOP)
        );
        assert_eq!(
            fs.symlink("/file/x", "t").unwrap_err().errno(),
            Some(libc::ENOTDIR)
        );
        for bad in ["relative/x", "/a/../b", "/", ""] {
            assert!(
                matches!(fs.symlink(bad, "t"), Err(RootError::BadPath { .. })),
                "{bad:?}"
            );
        }
    }
    assert!(is_plain("/usr/lib/x"));
    assert!(!is_plain("/usr/../etc"));
    assert!(!is_plain("usr"));
}

/// A small random tree: directories, files and symlinks (absolute, relative, with `..`).
fn tree() -> impl Strategy<Value = Vec<(usize, u8, usize)>> {
    proptest::collection::vec((0usize..6, 0u8..5, 0usize..6), 1..14)
}

const NAMES: [&str; 6] = ["a", "b", "c", "lib", "usr", "etc"];

fn build(root: &Path, host: &Path, spec: &[(usize, u8, usize)]) {
    for (i, (dir, kind, to)) in spec.iter().enumerate() {
        let parent = if *dir < 3 {
            root.to_path_buf()
        } else {
            root.join(NAMES[*dir - 3])
        };
        if !parent.is_dir() {
            continue;
        }
        let p = parent.join(format!("{}{i}", NAMES[*to]));
        let _ = match kind {
            0 => std::fs::create_dir(&p),
            1 => std::fs::write(&p, "f"),
            2 => symlink(format!("/{}", NAMES[*to]), &p),
            3 => symlink(format!("../../{}", NAMES[*to]), &p),
            _ => symlink(host, &p),
        };
        let top = root.join(NAMES[*to]);
        if *kind == 0 && !top.exists() {
            let _ = std::fs::create_dir(&top);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The walk resolves every path exactly as `openat2(RESOLVE_IN_ROOT)` does, and neither
    /// ever resolves to anything outside the root.
    #[test]
    fn the_walk_agrees_with_openat2(spec in tree(), probe in proptest::collection::vec(0usize..6, 1..5)) {
        let (_t, root, host) = setup();
        build(&root, &host, &spec);
        let fast = Root::open_with(&root, Resolver::Auto).unwrap();
        let walk = Root::open_with(&root, Resolver::Walk).unwrap();
        let _ = fast.open_path("/", true);
        if std::env::var_os("MQFQ_REQUIRE_CONTAINERD").is_some() {
            // Where the tests must run for real, the comparison must not be the walk with itself.
            prop_assert_eq!(OPENAT2.load(Ordering::Relaxed), 1, "openat2 is not available");
        }
        let host_id = {
            let st = nix::sys::stat::stat(&host).unwrap();
            (st.st_dev, st.st_ino)
        };
        // Probe every entry the tree made, and some made-up paths.
        let mut paths: Vec<String> = walkdir(&root);
        paths.push(format!("/{}", probe.iter().map(|&i| NAMES[i]).collect::<Vec<_>>().join("/")));
        for p in paths {
            for follow in [true, false] {
                let a = fast.identity(&p, follow).map_err(|e| e.errno());
                let b = walk.identity(&p, follow).map_err(|e| e.errno());
                prop_assert_eq!(a, b, "{} follow={}", p, follow);
                prop_assert_ne!(a.ok(), Some(host_id));
            }
        }
    }
}

fn walkdir(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            out.push(format!("/{}", p.strip_prefix(root).unwrap().display()));
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p);
            }
        }
    }
    out
}

fn unsafe_free_is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
}
