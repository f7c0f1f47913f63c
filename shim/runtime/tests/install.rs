//! `packaging/install/mqfq-containerd.sh` against the containerd under test (the system's, or
//! `MQFQ_CONTAINERD_DIR`'s: CI runs 1.6, 1.7 and 2.1): on a node with no config, and on one whose
//! config holds the user's own CRI settings, `register` makes containerd see the mqfq runtime
//! (`containerd config dump`) without losing any of those settings, a second `register` changes
//! nothing, and `unregister` gives the config back byte for byte — or, when the user edited it
//! since, takes out only what register added. A config containerd refuses is left alone.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/install/mqfq-containerd.sh")
}

/// Runs the script on `root`: (exit code, stdout, stderr).
fn run(root: &Path, verb: &str) -> (i32, String, String) {
    let o = Command::new("sh")
        .arg(script())
        .arg(verb)
        .env("ROOT", root)
        // The containerd under test checks the config (not one chrooted into `root`).
        .env("CONTAINERD", "containerd")
        .env("PATH", mqfq_testkit::tool_path())
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn config(root: &Path) -> PathBuf {
    root.join("etc/containerd/config.toml")
}

/// What containerd makes of the config under `root`.
fn dump(root: &Path) -> String {
    let o = Command::new("containerd")
        .arg("--config")
        .arg(config(root))
        .args(["config", "dump"])
        .env("PATH", mqfq_testkit::tool_path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// The user's own config for this containerd line: a sandbox image and another runtime.
fn users_config(v3: bool) -> String {
    if v3 {
        "version = 3\n\n# the user's\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  \
         sandbox = \"registry.example/pause:9.9\"\n\n\
         [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.kata]\n  \
         runtime_type = \"io.containerd.kata.v2\"\n"
            .to_owned()
    } else {
        "version = 2\n\n# the user's\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  \
         sandbox_image = \"registry.example/pause:9.9\"\n  \
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kata]\n    \
         runtime_type = \"io.containerd.kata.v2\""
            .to_owned() // no final newline: the block must still start on its own line
    }
}

/// Where the package puts the shim (`register`'s default).
const PACKAGED_SHIM: &str = "/usr/bin/containerd-shim-mqfq-v2";

/// containerd's dump shows the runtime as `register` writes it: on 1.x by its type; on 2.x by
/// runc's type with the shim as its path (so that CRI asks the shim for its features).
fn sees_mqfq(d: &str, shim: &str) {
    if d.contains("version = 3") {
        assert!(!d.contains("io.containerd.mqfq.v2"), "{d}");
        assert!(
            d.contains(&format!("runtime_path = '{shim}'"))
                || d.contains(&format!("runtime_path = \"{shim}\"")),
            "{d}"
        );
    } else {
        assert!(d.contains("io.containerd.mqfq.v2"), "{d}");
    }
    assert!(d.contains("io.mqfq.*"), "annotations: {d}");
}

#[test]
fn register_keeps_the_users_config_and_unregister_gives_it_back() {
    if !mqfq_testkit::have("containerd") {
        assert!(
            std::env::var_os("MQFQ_REQUIRE_CONTAINERD").is_none(),
            "containerd is missing"
        );
        eprintln!("SKIPPED: no containerd");
        return;
    }
    let v3 = mqfq_testkit::containerd_version().0 >= 2;
    let dir = tempfile::tempdir().unwrap();

    // A node with no config: register writes one, unregister removes everything.
    let bare = dir.path().join("bare");
    std::fs::create_dir_all(&bare).unwrap();
    assert_eq!(run(&bare, "register").1, "changed");
    sees_mqfq(&dump(&bare), PACKAGED_SHIM);
    assert_eq!(run(&bare, "register").1, "unchanged");
    assert_eq!(run(&bare, "unregister").1, "changed");
    let left: Vec<_> = std::fs::read_dir(bare.join("etc/containerd"))
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");

    // The user's config: kept whole, byte for byte back after unregister.
    let node = dir.path().join("node");
    std::fs::create_dir_all(node.join("etc/containerd")).unwrap();
    let original = users_config(v3);
    std::fs::write(config(&node), &original).unwrap();
    let (code, out, err) = run(&node, "register");
    assert_eq!((code, out.as_str()), (0, "changed"), "{err}");
    let d = dump(&node);
    sees_mqfq(&d, PACKAGED_SHIM);
    assert!(
        d.contains("registry.example/pause:9.9"),
        "the user's sandbox image lost: {d}"
    );
    assert!(
        d.contains("io.containerd.kata.v2"),
        "the user's runtime lost: {d}"
    );
    let registered = std::fs::read(config(&node)).unwrap();
    assert_eq!(run(&node, "register").1, "unchanged");
    assert_eq!(
        std::fs::read(config(&node)).unwrap(),
        registered,
        "register is idempotent"
    );
    assert_eq!(run(&node, "unregister").1, "changed");
    assert_eq!(std::fs::read_to_string(config(&node)).unwrap(), original);
    assert_eq!(run(&node, "unregister").1, "unchanged");

    // Edited after register: unregister takes out only what register added.
    run(&node, "register");
    let edited = format!(
        "{}\n# the user's later edit\n",
        std::fs::read_to_string(config(&node)).unwrap()
    );
    std::fs::write(config(&node), &edited).unwrap();
    let (_, out, err) = run(&node, "unregister");
    assert_eq!(out, "changed");
    assert!(err.contains("edited since register"), "{err}");
    let now = std::fs::read_to_string(config(&node)).unwrap();
    assert!(
        now.contains("# the user's later edit") && now.contains("# the user's"),
        "{now}"
    );
    assert!(!now.contains("mqfq"), "{now}");
    let d = dump(&node);
    assert!(
        !d.contains("io.containerd.mqfq.v2") && !d.contains("containerd-shim-mqfq-v2"),
        "{d}"
    );
    assert!(d.contains("io.containerd.kata.v2"), "{d}");

    // A config containerd refuses: register says why and changes nothing.
    let broken = dir.path().join("broken");
    std::fs::create_dir_all(broken.join("etc/containerd")).unwrap();
    let bad = format!("{}\n[plugins\n", users_config(v3));
    std::fs::write(config(&broken), &bad).unwrap();
    let (code, _, err) = run(&broken, "register");
    assert_ne!(code, 0);
    assert!(err.contains("containerd refuses"), "{err}");
    assert_eq!(std::fs::read_to_string(config(&broken)).unwrap(), bad);
    assert!(!broken.join("etc/containerd/config.toml.tmp").exists());
}

#[test]
fn an_existing_import_list_gets_one_more_entry() {
    if !mqfq_testkit::have("containerd") || mqfq_testkit::containerd_version().0 < 2 {
        eprintln!("SKIPPED: imports are used with containerd 2 only");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("etc/containerd/extra")).unwrap();
    std::fs::write(
        root.join("etc/containerd/extra/a.toml"),
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.kata]\n  \
         runtime_type = \"io.containerd.kata.v2\"\n",
    )
    .unwrap();
    let original = "version = 3\nimports = [\"extra/a.toml\"]\n";
    std::fs::write(config(root), original).unwrap();
    assert_eq!(run(root, "register").1, "changed");
    let text = std::fs::read_to_string(config(root)).unwrap();
    assert!(
        text.contains("imports = [\"conf.d/mqfq.toml\", \"extra/a.toml\"]"),
        "{text}"
    );
    let d = dump(root);
    sees_mqfq(&d, PACKAGED_SHIM);
    assert!(d.contains("io.containerd.kata.v2"), "{d}");
    assert_eq!(run(root, "unregister").1, "changed");
    assert_eq!(std::fs::read_to_string(config(root)).unwrap(), original);

    // Registered, then the list reformatted by hand: only the entry goes, the list stays TOML.
    assert_eq!(run(root, "register").1, "changed");
    std::fs::write(
        config(root),
        "version = 3\nimports = [ \"conf.d/mqfq.toml\" , \"extra/a.toml\" ]\n",
    )
    .unwrap();
    assert_eq!(run(root, "unregister").1, "changed");
    let text = std::fs::read_to_string(config(root)).unwrap();
    assert_eq!(text, "version = 3\nimports = [ \"extra/a.toml\" ]\n");
    assert!(dump(root).contains("io.containerd.kata.v2"), "{text}");
}

/// containerd 2.x registration gives the runtime runc's type, so CRI would read the mqfq
/// runtime's options as runc's and drop the others without a word (the shim's own keys, or
/// `ConfigPath`, as the 1.x form takes them): register refuses such a config, naming the keys,
/// and changes nothing. A shim path that is not the shim's is refused too. (Checked on the
/// config file, before containerd is asked: the same on every line.)
#[test]
fn register_refuses_options_containerd_2_would_drop() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
    let users = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.mqfq.options]\n  \
                 BinaryName = \"runc\"\n  ConfigPath = \"/etc/mqfq/shim.toml\"\n  systemd_cgroup = true\n";
    std::fs::write(config(root), users).unwrap();
    let (code, _, err) = run(root, "register");
    assert_ne!(code, 0);
    assert!(err.contains("drop: ConfigPath systemd_cgroup - "), "{err}");
    assert_eq!(std::fs::read_to_string(config(root)).unwrap(), users);
    assert!(!root.join("etc/containerd/conf.d/mqfq.toml").exists());
    // runc's own names pass that check.
    std::fs::write(
        config(root),
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.mqfq.options]\n  \
         BinaryName = \"runc\"\n  SystemdCgroup = true\n",
    )
    .unwrap();
    let (_, _, err) = run(root, "register");
    assert!(!err.contains("silently drop"), "{err}");
    // The shim's path must name the shim (and be absolute, of plain characters).
    for bad in [
        "/usr/bin/runc",
        "bin/containerd-shim-mqfq-v2",
        "/x\"y/containerd-shim-mqfq-v2",
    ] {
        let o = Command::new("sh")
            .arg(script())
            .arg("register")
            .env("ROOT", root)
            .env("MQFQ_SHIM_PATH", bad)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{bad}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("MQFQ_SHIM_PATH"),
            "{bad}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// With `text` as the config, unregister changes nothing and says why: the block is not a
/// matched pair.
fn unregister_touches_nothing(node: &Path, text: &str) {
    std::fs::write(config(node), text).unwrap();
    let (code, out, err) = run(node, "unregister");
    assert_eq!((code, out.as_str()), (0, "unchanged"), "{err}");
    assert!(err.contains("not its end marker"), "{err}");
    assert_eq!(std::fs::read_to_string(config(node)).unwrap(), text);
}

/// What the user wrote by hand is never lost: a config registered again after the user took
/// the runtime out is given back as it was at that second register (not as at the first); a
/// runtime the user named mqfq of another type stops register; a block whose end marker is
/// gone stops unregister from deleting to the end of the file.
#[test]
fn hand_edits_are_never_lost() {
    if !mqfq_testkit::have("containerd") {
        eprintln!("SKIPPED: no containerd");
        return;
    }
    let v3 = mqfq_testkit::containerd_version().0 >= 2;
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path();
    std::fs::create_dir_all(node.join("etc/containerd")).unwrap();
    std::fs::write(config(node), users_config(v3)).unwrap();
    assert_eq!(run(node, "register").1, "changed");
    // The user takes the runtime out by hand and changes something else.
    let by_hand = format!(
        "{}
# changed by hand
",
        users_config(v3)
    );
    std::fs::write(config(node), &by_hand).unwrap();
    assert_eq!(run(node, "register").1, "changed");
    assert_eq!(run(node, "unregister").1, "changed");
    assert_eq!(std::fs::read_to_string(config(node)).unwrap(), by_hand);

    // A runtime named mqfq that is not ours, in either quoting of the key.
    let table = if v3 {
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'mqfq']"
    } else {
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.\"mqfq\"]"
    };
    let theirs = format!(
        "{}\n{table}\n  runtime_type = \"io.containerd.runc.v2\"\n",
        users_config(v3)
    );
    std::fs::write(config(node), &theirs).unwrap();
    let (code, _, err) = run(node, "register");
    assert_ne!(code, 0);
    assert!(err.contains("already has a runtime named mqfq"), "{err}");
    assert_eq!(std::fs::read_to_string(config(node)).unwrap(), theirs);
    assert!(
        !node.join("etc/containerd/conf.d/mqfq.toml").exists(),
        "a refused register left its drop-in"
    );

    // The begin marker without the end marker: unregister touches nothing.
    let cut = format!(
        "{}\n# BEGIN mqfq-shim (mqfq-containerd.sh; unregister removes this block)\n\
         [plugins.\"x\"]\n\n# the user's settings after it\n",
        users_config(v3)
    );
    unregister_touches_nothing(node, &cut);

    // An end marker above the begin marker is not its end (issue 35): unregister touches
    // nothing (it had deleted from the begin marker to the end of the file).
    let stray = format!(
        "{}\n# END mqfq-shim\n# BEGIN mqfq-shim (mqfq-containerd.sh; unregister removes this block)\n\
         [plugins.\"x\"]\n\n# the user's settings after it\nSystemdCgroup = true\n",
        users_config(v3)
    );
    unregister_touches_nothing(node, &stray);

    // A whole block, then a second begin marker without an end: not one matched pair, so
    // nothing is deleted (the prefix match had deleted from the second one to the end).
    let begin = "# BEGIN mqfq-shim (mqfq-containerd.sh; unregister removes this block)";
    let twice = format!(
        "{}\n{begin}\n[plugins.\"x\"]\n# END mqfq-shim\n{begin}\n# the user's settings after it\n\
         SystemdCgroup = true\n",
        users_config(v3)
    );
    unregister_touches_nothing(node, &twice);
}

/// Configs register must leave alone: Docker's containerd.io turns CRI off (nothing to
/// register, and installing must not fail); a symlinked config.toml (under a mounted host root
/// its target may resolve elsewhere). An upgrade brings register's own block up to date.
#[test]
fn configs_without_cri_or_behind_a_link_are_left_alone_and_blocks_are_refreshed() {
    if !mqfq_testkit::have("containerd") {
        eprintln!("SKIPPED: no containerd");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path();
    std::fs::create_dir_all(node.join("etc/containerd")).unwrap();
    let docker = "#   Copyright 2018-2022 Docker Inc.\n\ndisabled_plugins = [\"cri\"]\n";
    std::fs::write(config(node), docker).unwrap();
    let (code, out, err) = run(node, "register");
    assert_eq!((code, out.as_str()), (0, "unchanged"), "{err}");
    assert!(err.contains("CRI plugin off"), "{err}");
    assert_eq!(std::fs::read_to_string(config(node)).unwrap(), docker);

    std::fs::remove_file(config(node)).unwrap();
    let real = node.join("elsewhere.toml");
    std::fs::write(
        &real,
        users_config(mqfq_testkit::containerd_version().0 >= 2),
    )
    .unwrap();
    std::os::unix::fs::symlink(&real, config(node)).unwrap();
    let (code, _, err) = run(node, "register");
    assert_ne!(code, 0);
    assert!(err.contains("symbolic link"), "{err}");
    assert!(
        std::fs::symlink_metadata(config(node))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    std::fs::remove_file(config(node)).unwrap();

    if mqfq_testkit::containerd_version().0 >= 2 {
        return; // the block is 1.6 / 1.7's
    }
    let original = users_config(false);
    std::fs::write(config(node), &original).unwrap();
    assert_eq!(run(node, "register").1, "changed");
    let current = std::fs::read_to_string(config(node)).unwrap();
    // An older release's block: other annotations.
    let older = current.replace(
        "pod_annotations = [\"io.mqfq.*\", \"serving.knative.dev/*\"]",
        "pod_annotations = [\"io.mqfq.*\"]",
    );
    assert_ne!(older, current);
    std::fs::write(config(node), &older).unwrap();
    assert_eq!(run(node, "register").1, "changed");
    assert_eq!(std::fs::read_to_string(config(node)).unwrap(), current);
    // The block's end marker gone, a copy of it above the block: the refresh changes nothing
    // (it had replaced everything from the begin marker to the end of the file).
    let stray = format!(
        "# END mqfq-shim\n{}# the user's settings after it\nSystemdCgroup = true\n",
        older.replace("# END mqfq-shim\n", "")
    );
    std::fs::write(config(node), &stray).unwrap();
    let (code, _, err) = run(node, "register");
    assert_ne!(code, 0);
    assert!(err.contains("not its end marker after it"), "{err}");
    assert_eq!(std::fs::read_to_string(config(node)).unwrap(), stray);
    std::fs::write(config(node), &current).unwrap();
    assert_eq!(run(node, "unregister").1, "changed");
    assert_eq!(std::fs::read_to_string(config(node)).unwrap(), original);
}

/// The node image's files under `dir/opt/mqfq` (programs that say their names, an interposer
/// that is only an ELF header); where they are.
fn image_files(dir: &Path) -> PathBuf {
    let src = dir.join("opt/mqfq");
    for b in ["containerd-shim-mqfq-v2", "mqfqd", "mqfqctl"] {
        let p = src.join("bin").join(b);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("#!/bin/sh\necho {b}\n")).unwrap();
    }
    std::fs::create_dir_all(src.join("lib")).unwrap();
    std::fs::write(src.join("lib/libmqfq_cuda.so"), b"\x7fELF\x02").unwrap();
    src
}

/// The node installer writes nothing through a symbolic link under the host's root: a link
/// planted at `/etc/mqfq` (absolute, so it would resolve inside the installer's container, or
/// anywhere) stops the install before anything is written there (it had written through it).
#[test]
fn the_node_installer_writes_nothing_through_a_symbolic_link() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let src = image_files(dir.path());
    let mqfqd_toml = dir.path().join("mqfqd.toml");
    std::fs::write(&mqfqd_toml, "backend = \"auto\"\n").unwrap();
    let host = dir.path().join("host");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(host.join("etc")).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, host.join("etc/mqfq")).unwrap();
    let o = Command::new("sh")
        .arg(repo.join("packaging/kubernetes/node/mqfq-node-installer.sh"))
        .arg("install")
        .env("HOST", &host)
        .env("SRC", &src)
        .env("CONFIG", &mqfqd_toml)
        .env("SYSTEMCTL", "true")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("/etc/mqfq is a symbolic link"), "{err}");
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "written through the link"
    );
}

/// The node installer (`packaging/kubernetes/node/mqfq-node-installer.sh`) on a fake host: it
/// installs the files, starts mqfqd and restarts containerd once; run again (a pod restart) it
/// restarts nothing; `uninstall` leaves the host as it found it.
#[test]
fn the_node_installer_installs_once_and_uninstalls_everything() {
    if !mqfq_testkit::have("containerd") {
        eprintln!("SKIPPED: no containerd");
        return;
    }
    let v3 = mqfq_testkit::containerd_version().0 >= 2;
    let dir = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let src = image_files(dir.path());
    std::fs::create_dir_all(src.join("systemd")).unwrap();
    std::fs::copy(
        repo.join("packaging/systemd/mqfqd.service"),
        src.join("systemd/mqfqd.service"),
    )
    .unwrap();
    std::fs::copy(script(), src.join("mqfq-containerd.sh")).unwrap();
    let mqfqd_toml = dir.path().join("mqfqd.toml");
    std::fs::write(&mqfqd_toml, "backend = \"auto\"\n").unwrap();
    // The host, with the user's containerd config; systemd is a log.
    let host = dir.path().join("host");
    std::fs::create_dir_all(host.join("etc/containerd")).unwrap();
    let original = users_config(v3);
    std::fs::write(config(&host), &original).unwrap();
    let calls = dir.path().join("systemctl.log");
    let systemctl = dir.path().join("systemctl");
    std::fs::write(
        &systemctl,
        format!("#!/bin/sh\necho \"$*\" >> {}\n", calls.display()),
    )
    .unwrap();
    let installer = |verb: &str| {
        let o = Command::new("sh")
            .arg(repo.join("packaging/kubernetes/node/mqfq-node-installer.sh"))
            .arg(verb)
            .env("HOST", &host)
            .env("SRC", &src)
            .env("CONFIG", &mqfqd_toml)
            .env("SYSTEMCTL", format!("sh {}", systemctl.display()))
            .env("CONTAINERD", "containerd")
            .env("PATH", mqfq_testkit::tool_path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{verb}: {err}");
        let log = std::fs::read_to_string(&calls).unwrap_or_default();
        let _ = std::fs::remove_file(&calls);
        (log, err)
    };
    use std::os::unix::fs::PermissionsExt;
    let (log, _) = installer("install");
    assert_eq!(
        log,
        "daemon-reload\nenable mqfqd.service\nrestart mqfqd.service\nrestart containerd.service\n"
    );
    for (p, mode) in [
        ("usr/local/bin/containerd-shim-mqfq-v2", 0o755),
        ("usr/local/bin/mqfqd", 0o755),
        ("usr/local/bin/mqfqctl", 0o755),
        ("usr/lib/mqfq/libmqfq_cuda.so", 0o644),
        ("etc/mqfq/mqfqd.toml", 0o644),
        ("etc/systemd/system/mqfqd.service", 0o644),
    ] {
        let m = std::fs::metadata(host.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(m.permissions().mode() & 0o777, mode, "{p}");
    }
    sees_mqfq(&dump(&host), "/usr/local/bin/containerd-shim-mqfq-v2");
    // A pod restart: nothing changed, nothing restarted.
    let (log, _) = installer("install");
    assert_eq!(log, "", "a second install restarted something");
    // A new config from the ConfigMap restarts mqfqd only.
    std::fs::write(&mqfqd_toml, "backend = \"simulated\"\n").unwrap();
    let (log, _) = installer("install");
    assert_eq!(log, "enable mqfqd.service\nrestart mqfqd.service\n");
    // Uninstall: the host as it was.
    let (log, err) = installer("uninstall");
    assert_eq!(
        log, "restart containerd.service\ndisable --now mqfqd.service\ndaemon-reload\n",
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(config(&host)).unwrap(), original);
    let mut left = Vec::new();
    for d in ["usr", "etc/mqfq", "etc/systemd", "etc/containerd"] {
        for e in walk(&host.join(d)) {
            left.push(e);
        }
    }
    assert_eq!(
        left,
        vec![config(&host)],
        "only the user's containerd config remains"
    );
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.filter_map(Result::ok) {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}
