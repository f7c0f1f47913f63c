//! How a container's GPU memory reaches the Warm tier, chosen per container: by the driver's
//! checkpoint API (its processes are suspended whole, context included, and nothing of their
//! allocations is converted), by the interposer's managed-memory conversion (`uvm`), or not at
//! all (`off`: the container is never moved by the pool). mqfqd's `[pool] warm`, a pod's
//! annotation (`mqfq_proto::warm::ANNOTATION`) and the simulator's `--warm` all name it in the
//! same words, parsed here once.

use std::fmt;
use std::str::FromStr;

/// A Warm-tier backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Warm {
    /// The driver's checkpoint API (`cuCheckpointProcess*`), driven by the shim.
    Checkpoint,
    /// The interposer converts allocations to managed memory and moves them.
    #[default]
    Uvm,
    /// The pool never moves the container's memory.
    Off,
}

impl Warm {
    /// The word for it (as in the annotation and the configuration).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Warm::Checkpoint => "checkpoint",
            Warm::Uvm => "uvm",
            Warm::Off => "off",
        }
    }
}

impl fmt::Display for Warm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A value that names no backend.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a Warm-tier backend (checkpoint, uvm or off)")]
pub struct WarmError {
    /// What was given, cut to 64 characters.
    pub value: String,
}

impl serde::Serialize for Warm {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl Warm {
    /// From a request's field: empty (an older shim) is `uvm`.
    ///
    /// # Errors
    /// Any other value that names no backend.
    pub fn from_wire(s: &str) -> Result<Self, WarmError> {
        if s.is_empty() {
            Ok(Warm::Uvm)
        } else {
            s.parse()
        }
    }
}

impl<'de> serde::Deserialize<'de> for Warm {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl FromStr for Warm {
    type Err = WarmError;
    fn from_str(s: &str) -> Result<Self, WarmError> {
        match s {
            "checkpoint" => Ok(Warm::Checkpoint),
            "uvm" => Ok(Warm::Uvm),
            "off" => Ok(Warm::Off),
            other => Err(WarmError {
                value: other.chars().take(64).collect(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_nothing_else_parses() {
        for w in [Warm::Checkpoint, Warm::Uvm, Warm::Off] {
            assert_eq!(w.as_str().parse::<Warm>(), Ok(w));
        }
        for bad in ["", "Checkpoint", "uvm ", "on", "checkpoint,uvm"] {
            let e = bad.parse::<Warm>().unwrap_err();
            assert!(e.to_string().contains("not a Warm-tier backend"), "{e}");
        }
        let long = "x".repeat(1000);
        assert_eq!(long.parse::<Warm>().unwrap_err().value.len(), 64);
    }
}
