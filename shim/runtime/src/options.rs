//! Runtime options, decoded by their `type_url`.
//!
//! containerd sends options on `start`'s stdin and in `CreateTaskRequest.options`. Which type
//! arrives depends on the caller: runc's `containerd.runc.v1.Options` (from `ctr` with runc flags
//! or a runtime configured like runc), CRI's `runtimeoptions.v1.Options` for every non-runc runtime
//! (a `config_path`, or since containerd 1.7 the whole TOML table in `config_body`), or nothing.
//! The two share field numbers with different meanings, so decoding blindly as runc options turns a
//! CRI config body into a shim cgroup path. Unknown types are tolerated with a log line.

use std::path::PathBuf;

use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::shim::oci::Options as RuncOptionsProto;
use serde::Deserialize;

use crate::error::{Error, Result};

/// The shim's own configuration, from CRI `config_path` / `config_body` (TOML).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShimConfig {
    /// runc binary (name on PATH or absolute path).
    #[serde(default)]
    pub binary_name: Option<String>,
    /// runc state root.
    #[serde(default)]
    pub root: Option<String>,
    /// Use the systemd cgroup driver.
    #[serde(default)]
    pub systemd_cgroup: bool,
    /// Pass `--no-pivot` to runc.
    #[serde(default)]
    pub no_pivot_root: bool,
    /// Pass `--no-new-keyring` to runc.
    #[serde(default)]
    pub no_new_keyring: bool,
}

/// What the options say, whatever their type. Saved in the bundle at Create so that `delete`
/// after a crashed shim cleans up with the same runc and root.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct RuntimeOptions {
    /// runc binary.
    pub binary_name: Option<String>,
    /// runc root.
    pub root: Option<String>,
    /// systemd cgroups.
    pub systemd_cgroup: bool,
    /// `--no-pivot`.
    pub no_pivot_root: bool,
    /// `--no-new-keyring`.
    pub no_new_keyring: bool,
    /// Cgroup to put the shim itself in (runc options only).
    pub shim_cgroup: Option<String>,
}

impl From<ShimConfig> for RuntimeOptions {
    fn from(c: ShimConfig) -> Self {
        RuntimeOptions {
            binary_name: c.binary_name,
            root: c.root,
            systemd_cgroup: c.systemd_cgroup,
            no_pivot_root: c.no_pivot_root,
            no_new_keyring: c.no_new_keyring,
            shim_cgroup: None,
        }
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// CRI's `runtimeoptions.v1.Options`: 1 `type_url`, 2 `config_path`, 3 `config_body`.
pub(crate) fn decode_cri(bytes: &[u8]) -> Result<(String, Vec<u8>)> {
    let mut path = String::new();
    let mut body = Vec::new();
    let mut i = 0;
    let bad = || Error::InvalidArgument("runtimeoptions.v1.Options: malformed protobuf".into());
    let varint = |i: &mut usize| -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *bytes.get(*i).ok_or_else(bad)?;
            *i += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad())
    };
    while i < bytes.len() {
        let key = varint(&mut i)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                varint(&mut i)?;
            }
            2 => {
                let len = usize::try_from(varint(&mut i)?).map_err(|_| bad())?;
                let end = i
                    .checked_add(len)
                    .filter(|e| *e <= bytes.len())
                    .ok_or_else(bad)?;
                let v = &bytes[i..end];
                i = end;
                match field {
                    2 => path = String::from_utf8(v.to_vec()).map_err(|_| bad())?,
                    3 => body = v.to_vec(),
                    _ => {}
                }
            }
            5 => i += 4,
            1 => i += 8,
            _ => return Err(bad()),
        }
    }
    Ok((path, body))
}

pub(crate) fn parse_config(text: &str, origin: &str) -> Result<ShimConfig> {
    toml::from_str(text).map_err(|e| Error::invalid(origin, e))
}

/// Decodes runtime options. `None` or an empty `Any` gives defaults.
///
/// # Errors
/// [`Error::InvalidArgument`] for malformed runc or CRI options, an unreadable `config_path`, or a
/// config that is not valid TOML for [`ShimConfig`] (the message names the key).
pub fn decode(any: Option<&Any>) -> Result<RuntimeOptions> {
    let Some(any) = any.filter(|a| !a.type_url.is_empty() || !a.value.is_empty()) else {
        return Ok(RuntimeOptions::default());
    };
    let name = any.type_url.rsplit('/').next().unwrap_or_default();
    match name {
        "containerd.runc.v1.Options" => {
            let o = RuncOptionsProto::parse_from_bytes(&any.value)
                .map_err(|e| Error::invalid("containerd.runc.v1.Options", e))?;
            Ok(RuntimeOptions {
                binary_name: non_empty(&o.binary_name),
                root: non_empty(&o.root),
                systemd_cgroup: o.systemd_cgroup,
                no_pivot_root: o.no_pivot_root,
                no_new_keyring: o.no_new_keyring,
                shim_cgroup: non_empty(&o.shim_cgroup),
            })
        }
        "runtimeoptions.v1.Options" => {
            let (path, body) = decode_cri(&any.value)?;
            let cfg = if !body.is_empty() {
                let text = String::from_utf8(body).map_err(|_| {
                    Error::InvalidArgument("runtimeoptions config_body is not UTF-8".into())
                })?;
                parse_config(&text, "runtime options config_body")?
            } else if !path.is_empty() {
                let text = std::fs::read_to_string(PathBuf::from(&path)).map_err(|e| {
                    Error::invalid(format!("runtime options config_path {path}"), e)
                })?;
                parse_config(&text, &format!("runtime options config_path {path}"))?
            } else {
                ShimConfig::default()
            };
            Ok(cfg.into())
        }
        other => {
            tracing::warn!(type_url = %any.type_url, "ignoring runtime options of unknown type {other}");
            Ok(RuntimeOptions::default())
        }
    }
}

/// Reads and decodes options from raw `Any` bytes (what `start` gets on stdin).
///
/// # Errors
/// As [`decode`], plus bytes that are not an `Any`.
pub fn decode_bytes(bytes: &[u8]) -> Result<RuntimeOptions> {
    if bytes.is_empty() {
        return Ok(RuntimeOptions::default());
    }
    let any = Any::parse_from_bytes(bytes).map_err(|e| Error::invalid("runtime options", e))?;
    decode(Some(&any))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(type_url: &str, value: Vec<u8>) -> Any {
        Any {
            type_url: type_url.into(),
            value,
            ..Default::default()
        }
    }

    fn cri(path: &str, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        let mut field = |n: u8, data: &[u8]| {
            v.push((n << 3) | 2);
            v.push(u8::try_from(data.len()).unwrap());
            v.extend_from_slice(data);
        };
        field(1, b"io.containerd.mqfq.v2");
        field(2, path.as_bytes());
        field(3, body);
        v
    }

    #[test]
    fn none_and_empty_are_defaults() {
        assert_eq!(decode(None).unwrap(), RuntimeOptions::default());
        assert_eq!(decode_bytes(&[]).unwrap(), RuntimeOptions::default());
    }

    #[test]
    fn runc_options() {
        let o = RuncOptionsProto {
            binary_name: "/usr/sbin/runc".into(),
            systemd_cgroup: true,
            shim_cgroup: "/shims".into(),
            ..Default::default()
        };
        let a = any("containerd.runc.v1.Options", o.write_to_bytes().unwrap());
        let r = decode(Some(&a)).unwrap();
        assert_eq!(r.binary_name.as_deref(), Some("/usr/sbin/runc"));
        assert!(r.systemd_cgroup);
        assert_eq!(r.shim_cgroup.as_deref(), Some("/shims"));
        let bytes = a.write_to_bytes().unwrap();
        assert_eq!(decode_bytes(&bytes).unwrap(), r);
    }

    #[test]
    fn cri_body_is_not_mistaken_for_a_shim_cgroup() {
        let body = b"binary_name = \"runc\"\nsystemd_cgroup = true\n";
        let a = any("runtimeoptions.v1.Options", cri("", body));
        let r = decode(Some(&a)).unwrap();
        assert_eq!(r.binary_name.as_deref(), Some("runc"));
        assert!(r.systemd_cgroup);
        assert_eq!(r.shim_cgroup, None);
    }

    #[test]
    fn cri_config_path() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("mqfq.toml");
        std::fs::write(&p, "root = \"/run/mqfq-runc\"\n").unwrap();
        let a = any("runtimeoptions.v1.Options", cri(p.to_str().unwrap(), b""));
        assert_eq!(
            decode(Some(&a)).unwrap().root.as_deref(),
            Some("/run/mqfq-runc")
        );
        let missing = any(
            "runtimeoptions.v1.Options",
            cri("/nonexistent/mqfq.toml", b""),
        );
        let e = decode(Some(&missing)).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/mqfq.toml"), "{e}");
    }

    #[test]
    fn bad_config_names_the_key() {
        let a = any(
            "runtimeoptions.v1.Options",
            cri("", b"binary_nmae = \"runc\"\n"),
        );
        let e = decode(Some(&a)).unwrap_err().full_message();
        assert!(e.contains("binary_nmae"), "{e}");
        let a = any("runtimeoptions.v1.Options", vec![0x1a, 0x40]);
        decode(Some(&a)).unwrap_err();
    }

    #[test]
    fn unknown_types_are_tolerated() {
        let a = any("types.containerd.io/something.Else", vec![1, 2, 3]);
        assert_eq!(decode(Some(&a)).unwrap(), RuntimeOptions::default());
    }
}
