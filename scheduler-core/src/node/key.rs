//! Container keys: a containerd namespace and a container id, written `namespace/id` in the
//! dispatch log, metrics and `mqfqctl` (the simulator names its containers in a namespace of its
//! own). Neither part may hold a `/`, so the written form splits
//! back into exactly the key it came from.

use std::fmt;
use std::str::FromStr;

/// A key that cannot be: the field at fault and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid `{field}`: {value:?} must be non-empty, without '/'")]
pub struct KeyError {
    /// `namespace` or `container_id`.
    pub field: &'static str,
    /// What was given.
    pub value: String,
}

/// A container on this node: its containerd namespace and id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerKey {
    namespace: String,
    id: String,
}

fn part(field: &'static str, value: &str) -> Result<String, KeyError> {
    if value.is_empty() || value.contains('/') {
        return Err(KeyError {
            field,
            value: value.to_owned(),
        });
    }
    Ok(value.to_owned())
}

impl ContainerKey {
    /// The key of container `id` in `namespace`.
    ///
    /// # Errors
    /// Either part is empty or holds a `/` (the error names the field).
    pub fn new(namespace: &str, id: &str) -> Result<Self, KeyError> {
        Ok(Self {
            namespace: part("namespace", namespace)?,
            id: part("container_id", id)?,
        })
    }

    /// The containerd namespace.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The container id.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Display for ContainerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.id)
    }
}

/// Equal to its written form, `namespace/id`.
impl PartialEq<str> for ContainerKey {
    fn eq(&self, other: &str) -> bool {
        other
            .split_once('/')
            .is_some_and(|(ns, id)| ns == self.namespace && id == self.id)
    }
}

impl PartialEq<&str> for ContainerKey {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

/// Written as `namespace/id` (the dispatch record, `mqfqctl --json`).
impl serde::Serialize for ContainerKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ContainerKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl FromStr for ContainerKey {
    type Err = KeyError;

    /// `namespace/id`, as [`Display`](fmt::Display) writes it.
    fn from_str(s: &str) -> Result<Self, KeyError> {
        let (ns, id) = s.split_once('/').ok_or_else(|| KeyError {
            field: "container_id",
            value: String::new(),
        })?;
        Self::new(ns, id)
    }
}

/// Whether a function key or tenant name is well formed: 1–253 characters from
/// `A–Z a–z 0–9 . _ - : / @ +`. They become metric labels and log fields; pods choose them.
#[must_use]
pub fn is_key(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:/@+".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_form_parses_back_and_bad_parts_name_their_field() {
        let k = ContainerKey::new("k8s.io", "abc-1").unwrap();
        assert_eq!(k.to_string(), "k8s.io/abc-1");
        assert_eq!("k8s.io/abc-1".parse::<ContainerKey>().unwrap(), k);
        assert_eq!(ContainerKey::new("", "x").unwrap_err().field, "namespace");
        assert_eq!(
            ContainerKey::new("a/b", "x").unwrap_err().field,
            "namespace"
        );
        assert_eq!(
            ContainerKey::new("ns", "").unwrap_err().field,
            "container_id"
        );
        assert_eq!(
            ContainerKey::new("ns", "x/y").unwrap_err().field,
            "container_id"
        );
        "no-slash".parse::<ContainerKey>().unwrap_err();
        assert!(
            "ns/x/y".parse::<ContainerKey>().is_err(),
            "never a different key"
        );
    }

    #[test]
    fn function_keys_are_bounded_and_plain() {
        assert!(is_key("team/fn@v2+gpu:1"));
        assert!(!is_key(""));
        assert!(!is_key(&"a".repeat(254)));
        assert!(!is_key("fn name"));
        assert!(!is_key("fn\n"));
    }
}
