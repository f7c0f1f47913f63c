//! `mqfqctl completions <shell>` and `mqfqctl man`: generated from the same definition as the
//! commands, so they name every subcommand and flag; they need no daemon, and a closed pipe is
//! an error, not a panic.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::process::{Command, Stdio};

fn mqfqctl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mqfqctl"))
        .args(args)
        // No daemon anywhere near.
        .env("MQFQ_DAEMON_SOCKET", "/nonexistent/mqfqd.sock")
        .output()
        .unwrap()
}

#[test]
fn completions_and_the_manual_name_every_command() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = mqfqctl(&["completions", shell]);
        assert!(
            o.status.success(),
            "{shell}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let text = String::from_utf8(o.stdout).unwrap();
        for word in [
            "status",
            "top",
            "completions",
            "man",
            "socket",
            "json",
            "interval-ms",
        ] {
            assert!(text.contains(word), "{shell}: no {word}");
        }
    }
    // The bash script parses.
    let o = mqfqctl(&["completions", "bash"]);
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), &o.stdout).unwrap();
    if let Ok(check) = Command::new("bash").arg("-n").arg(script.path()).output() {
        assert!(
            check.status.success(),
            "{}",
            String::from_utf8_lossy(&check.stderr)
        );
    }
    let o = mqfqctl(&["man"]);
    assert!(o.status.success());
    let man = String::from_utf8(o.stdout).unwrap();
    assert!(man.contains(".TH mqfqctl 8"), "{man}");
    for word in ["status", "top", "completions", "MQFQ_DAEMON_SOCKET"] {
        assert!(man.contains(word), "man: no {word}");
    }
    // A shell it does not know: a usage error that lists the ones it does.
    let o = mqfqctl(&["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tcsh") && err.contains("bash"), "{err}");
}

#[test]
fn a_closed_pipe_is_an_error_not_a_panic() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mqfqctl"))
        .args(["completions", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes away before reading anything.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(!o.status.success() || err.is_empty(), "{err}");
}
