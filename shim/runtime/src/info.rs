//! `containerd-shim-mqfq-v2 -info`: what containerd 2.x asks a runtime about itself.
//!
//! containerd 2.x runs the shim binary with `-info`, the runtime's options (an `Any`) on stdin,
//! and reads a `containerd.types.RuntimeInfo` from stdout. CRI reads the OCI features in it to
//! decide what the runtime handler supports — recursive read-only mounts (`rro`), user
//! namespaces with ID-mapped mounts — and tells the kubelet, which refuses such pods on a handler
//! that reports nothing. Containers run through runc, so the shim reports what the runc its
//! options select reports (`runc features`), as runc's own shim does; where runc cannot say (an
//! old runc, or another runtime without the command), the answer carries no features, which is
//! what containerd expects of such a runtime.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::types::introspection::{RuntimeInfo, RuntimeVersion};

use crate::error::{Error, Result};

/// The runtime's name in the answer.
pub const NAME: &str = "io.containerd.mqfq.v2";
/// The type containerd reads the features as (the OCI runtime-spec's `features.Features`,
/// carried as JSON).
pub const FEATURES_TYPE: &str =
    "types.containerd.io/opencontainers/runtime-spec/1/features/Features";
/// The most options read from stdin, and of `runc features`' output.
const MAX_INPUT: u64 = 1 << 20;
/// How long `runc features` may take (it prints a constant table).
const FEATURES_TIMEOUT: Duration = Duration::from_secs(10);

/// The answer to `-info` for the options bytes containerd wrote to stdin (empty: none), with
/// the features of `features` — the runc the options select, asked by [`runc_features`].
///
/// # Errors
/// Options that do not decode (the message names them).
pub fn runtime_info(
    options: &[u8],
    features: impl FnOnce(&str) -> std::result::Result<Vec<u8>, String>,
) -> Result<RuntimeInfo> {
    // Parsed once: decoded for the runc it names, and echoed as runc's shim does (the options
    // containerd will create tasks with).
    let any = if options.is_empty() {
        None
    } else {
        Some(Any::parse_from_bytes(options).map_err(|e| Error::invalid("runtime options", e))?)
    };
    let opts = crate::options::decode(any.as_ref())?;
    let info_options = any.into();
    let mut info = RuntimeInfo {
        name: NAME.to_owned(),
        version: Some(RuntimeVersion {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            revision: option_env!("MQFQ_GIT_REVISION")
                .unwrap_or_default()
                .to_owned(),
            ..Default::default()
        })
        .into(),
        options: info_options,
        ..Default::default()
    };
    let binary = opts.binary_name.as_deref().unwrap_or("runc");
    match features(binary).and_then(|json| checked_features(&json)) {
        Ok(json) => {
            info.features = Some(Any {
                type_url: FEATURES_TYPE.to_owned(),
                value: json,
                ..Default::default()
            })
            .into();
        }
        // As runc's shim: a runtime that cannot tell its features is reported without them.
        Err(why) => eprintln!("{NAME} -info: no features from {binary}: {why}"),
    }
    Ok(info)
}

/// `runc features`' output must be a JSON object (the OCI features document); it is passed on
/// as compact JSON.
fn checked_features(json: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("its features are not JSON: {e}"))?;
    if !v.is_object() {
        return Err("its features are not a JSON object".to_owned());
    }
    serde_json::to_vec(&v).map_err(|e| e.to_string())
}

/// Runs `<binary> features` (a name on `PATH` or a path), within [`FEATURES_TIMEOUT`] for its
/// exit and its output both (a process it left behind holding the pipe open does not hold the
/// answer: the reader is abandoned, and `-info` exits right after).
///
/// # Errors
/// It cannot be run, fails, takes too long, or prints more than 1 MiB.
pub fn runc_features(binary: &str) -> std::result::Result<Vec<u8>, String> {
    features_within(binary, FEATURES_TIMEOUT)
}

fn features_within(binary: &str, timeout: Duration) -> std::result::Result<Vec<u8>, String> {
    let late = || "`features` did not answer in time".to_owned();
    let mut child = Command::new(binary)
        .arg("features")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run it: {e}"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(s) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = s.take(MAX_INPUT + 1).read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    }
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(late());
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    let out = rx
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .map_err(|_| late())?;
    if !status.success() {
        return Err(format!("`features` failed ({status})"));
    }
    if out.len() as u64 > MAX_INPUT {
        return Err("`features` printed more than 1 MiB".to_owned());
    }
    Ok(out)
}

/// The `-info` command: options from `stdin`, the answer's bytes.
///
/// # Errors
/// stdin cannot be read or holds options that do not decode.
pub fn run(stdin: impl Read) -> Result<Vec<u8>> {
    let mut options = Vec::new();
    stdin
        .take(MAX_INPUT)
        .read_to_end(&mut options)
        .map_err(|e| Error::io("read the runtime options from stdin", e))?;
    let info = runtime_info(&options, runc_features)?;
    info.write_to_bytes()
        .map_err(|e| Error::io("encode RuntimeInfo", std::io::Error::other(e)))
}

#[cfg(test)]
mod tests {
    use containerd_shim_protos::shim::oci::Options as RuncOptions;

    use super::*;

    const FEATURES: &str = r#"{"ociVersionMin":"1.0.0","ociVersionMax":"1.2.0",
        "mountOptions":["ro","rro","rbind"],"linux":{"namespaces":["user","mount"]}}"#;

    fn runc_options(binary: &str) -> Vec<u8> {
        let o = RuncOptions {
            binary_name: binary.to_owned(),
            ..Default::default()
        };
        Any {
            type_url: "containerd.runc.v1.Options".to_owned(),
            value: o.write_to_bytes().unwrap(),
            ..Default::default()
        }
        .write_to_bytes()
        .unwrap()
    }

    #[test]
    fn reports_the_features_of_the_runc_its_options_select() {
        let opts = runc_options("/opt/runc");
        let info = runtime_info(&opts, |bin| {
            assert_eq!(bin, "/opt/runc");
            Ok(FEATURES.as_bytes().to_vec())
        })
        .unwrap();
        assert_eq!(info.name, NAME);
        let f = info.features.as_ref().unwrap();
        assert_eq!(f.type_url, FEATURES_TYPE);
        let v: serde_json::Value = serde_json::from_slice(&f.value).unwrap();
        assert_eq!(v["mountOptions"][1], "rro");
        assert_eq!(
            info.options.as_ref().unwrap().type_url,
            "containerd.runc.v1.Options"
        );
        // Encoded, it reads back as containerd reads it.
        let back = RuntimeInfo::parse_from_bytes(&info.write_to_bytes().unwrap()).unwrap();
        assert_eq!(back, info);
    }

    #[test]
    fn no_options_ask_runc_on_path_and_no_answer_gives_no_features() {
        let info = runtime_info(&[], |bin| {
            assert_eq!(bin, "runc");
            Err("missing".to_owned())
        })
        .unwrap();
        assert!(info.features.is_none() && info.options.is_none());
        // Output that is not the features document is not passed on.
        for bad in ["", "[]", "not json", "\"rro\""] {
            let info = runtime_info(&[], |_| Ok(bad.as_bytes().to_vec())).unwrap();
            assert!(info.features.is_none(), "{bad:?}");
        }
    }

    #[test]
    fn options_that_do_not_decode_are_an_invalid_argument() {
        let e = runtime_info(b"\xff\xff\xff", |_| Ok(FEATURES.as_bytes().to_vec())).unwrap_err();
        assert_eq!(
            e.code(),
            containerd_shim_protos::ttrpc::Code::INVALID_ARGUMENT,
            "{e}"
        );
        assert!(e.to_string().contains("runtime options"), "{e}");
    }

    #[test]
    fn a_runtime_that_cannot_tell_is_reported_not_waited_for() {
        let missing = runc_features("/nonexistent/runc").unwrap_err();
        assert!(missing.contains("cannot run"), "{missing}");
        // `false features` fails; `true features` answers nothing, which is no document.
        let failed = runc_features("false").unwrap_err();
        assert!(failed.contains("failed"), "{failed}");
        let empty = checked_features(&runc_features("true").unwrap()).unwrap_err();
        assert!(empty.contains("not JSON"), "{empty}");
    }

    /// A runtime whose `features` exits but leaves a process holding its output open is given
    /// up on at the deadline, not waited for until that process ends.
    #[test]
    fn output_held_open_by_a_leftover_process_is_not_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("runc");
        // Waited for, the leftover's 5 s would end in an answer of `{}`.
        std::fs::write(&fake, "#!/bin/sh\n(sleep 5) &\necho '{}'\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let e = features_within(fake.to_str().unwrap(), Duration::from_millis(300)).unwrap_err();
        assert!(e.contains("in time"), "{e}");
    }
}
