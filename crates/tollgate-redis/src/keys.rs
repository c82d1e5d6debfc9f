//! Redis key names for rule states: `<prefix>:{<key>}:<rule signature>`.
//!
//! The caller's key sits inside a hash tag, so every state of one check lands in the same Redis
//! Cluster slot and the script runs unchanged on a cluster. `{`, `}` and `%` in the key are
//! percent-encoded: a `}` would otherwise end the tag early, and encoding keeps distinct keys
//! distinct. The rule's signature (algorithm and parameters) ends the name, so a changed rule
//! starts from fresh state instead of misreading the old one.

use std::fmt::Write;

/// Why a key prefix cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    /// Empty, or longer than 64 bytes.
    #[error("the key prefix must be 1 to 64 bytes long (got {0})")]
    Length(usize),
    /// Holds a brace, which would move the hash tag.
    #[error("the key prefix must not contain '{{' or '}}': it would move the cluster hash tag")]
    Brace,
}

pub(crate) fn validate_prefix(prefix: &str) -> Result<(), PrefixError> {
    if prefix.is_empty() || prefix.len() > 64 {
        Err(PrefixError::Length(prefix.len()))
    } else if prefix.contains(['{', '}']) {
        Err(PrefixError::Brace)
    } else {
        Ok(())
    }
}

/// `<prefix>:{<escaped key>}:`, the part shared by all of a check's state keys.
pub(crate) fn tagged(prefix: &str, key: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + key.len() + 40);
    out.push_str(prefix);
    out.push_str(":{");
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out.push_str("}:");
    out
}

/// The state key of one rule: the tagged key followed by the rule's signature (or
/// [`SHARED_HASH`](tollgate_core::script::SHARED_HASH), for the hash that hash-stored rules share).
pub(crate) fn state_key(tagged: &str, signature: &str) -> String {
    let mut out = String::with_capacity(tagged.len() + signature.len());
    let _ = write!(out, "{tagged}{signature}");
    out
}

/// The suffix of a key's heartbeat set (`<prefix>:{<key>}:instances`): the limiter instances
/// holding reservations on the key, scored by their last heartbeat in milliseconds. No rule
/// signature is a bare word, so it names no rule state.
pub(crate) const INSTANCES: &str = "instances";

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag (the bytes between
/// the first `{` and the first `}` after it, when not empty), else of the whole key.
pub(crate) fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tag = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            rest.iter().position(|&b| b == b'}').map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty());
    crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(bytes)) % crate::engine::CLUSTER_SLOTS as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_a_hash_tag_and_escape_braces() {
        assert_eq!(tagged("tg", "user:1"), "tg:{user:1}:");
        assert_eq!(tagged("tg", "a}b{c%"), "tg:{a%7Db%7Bc%25}:");
        assert_ne!(tagged("tg", "%7B"), tagged("tg", "{"));
        assert_eq!(state_key(&tagged("tg", "k"), "fw:1:1000"), "tg:{k}:fw:1:1000");
    }

    #[test]
    fn slots_are_redis_clusters() {
        // CLUSTER KEYSLOT's answers.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("bar"), 5061);
        assert_eq!(slot("tg:{foo}:h"), 12182, "the hash tag decides");
        // The edges of hash tags, as the redis crate's cluster client routes them.
        for key in ["a{}foo", "{foo", "}foo{", "{{foo}}", "x{foo}{bar}", "{}", "", "tg:{a%7Db}:h", "é{ü}"] {
            let theirs = format!("{:?}", redis::cluster_routing::Slot::for_key(key));
            assert_eq!(format!("Slot({})", slot(key)), theirs, "{key:?}");
        }
    }

    #[test]
    fn prefixes_are_checked() {
        assert!(validate_prefix("tollgate").is_ok());
        assert_eq!(validate_prefix(""), Err(PrefixError::Length(0)));
        assert_eq!(validate_prefix("a{b"), Err(PrefixError::Brace));
    }
}
