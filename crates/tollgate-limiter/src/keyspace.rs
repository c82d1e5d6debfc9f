//! The engine keys Tollgate builds for itself, owned here so that no two front ends can collide
//! and a caller's key cannot reach into them: consumer and anonymous checks (the HTTP API),
//! Envoy descriptors (the gRPC service), per-policy keys of the tower layer, and the one hash
//! that shortens an over-long key or hides a secret.
//!
//! Keys already stored in a backend depend on these spellings: changing a prefix or the hash
//! orphans every count kept under the old one.

use std::fmt::{Display, Write as _};

use sha2::{Digest, Sha256};
use tollgate_core::limits::MAX_KEY_BYTES;

/// A consumer's counts (`{"consumer": ...}` checks) are kept under this and its id.
pub const CONSUMER_PREFIX: &str = "consumer:";
/// An anonymous caller's counts (`{"anonymous_ip": ...}` checks), under this and its address.
pub const ANONYMOUS_PREFIX: &str = "anonymous:";
/// Every Envoy descriptor's key starts with this (`envoy:<domain>|key=value|...`) ...
pub const ENVOY_PREFIX: &str = "envoy:";
/// ... or, when that is too long, with this and the SHA-256 of it.
pub const ENVOY_HASHED_PREFIX: &str = "envoy#";

/// The prefixes of Tollgate's own keys. A caller's key may not start with one, so that no
/// decision request can spend or reset those counts.
pub const RESERVED_PREFIXES: [&str; 4] =
    [CONSUMER_PREFIX, ANONYMOUS_PREFIX, ENVOY_PREFIX, ENVOY_HASHED_PREFIX];

/// The reserved prefix `key` starts with, if any.
pub fn reserved_prefix(key: &str) -> Option<&'static str> {
    RESERVED_PREFIXES.iter().copied().find(|prefix| key.starts_with(prefix))
}

/// The key of a consumer's counts.
pub fn consumer_key(consumer: &str) -> String {
    format!("{CONSUMER_PREFIX}{consumer}")
}

/// The key of an anonymous caller's counts, by its address.
pub fn anonymous_key(ip: impl Display) -> String {
    format!("{ANONYMOUS_PREFIX}{ip}")
}

/// A descriptor's counting key: `k=v` pairs joined by `|`, with `%`, `|` and `=`
/// percent-encoded so no two descriptors share a key. One longer than the engine's key bound
/// (descriptors may hold 16 entries of 256-byte values) is replaced by its SHA-256.
pub fn envoy_key(domain: &str, entries: &[(&str, &str)]) -> String {
    // Written once into a buffer of the right size: this runs for every descriptor checked.
    let size = entries.iter().fold(ENVOY_PREFIX.len() + domain.len(), |n, (k, v)| n + 2 + k.len() + v.len());
    let mut key = String::with_capacity(size);
    key.push_str(ENVOY_PREFIX);
    push_escaped(&mut key, domain);
    for (k, v) in entries {
        key.push('|');
        push_escaped(&mut key, k);
        key.push('=');
        push_escaped(&mut key, v);
    }
    if key.len() <= MAX_KEY_BYTES {
        key
    } else {
        format!("{ENVOY_HASHED_PREFIX}{}", sha256_hex(key.as_bytes()))
    }
}

/// `s` with `%`, `|` and `=` percent-encoded, pushed onto `out`.
fn push_escaped(out: &mut String, s: &str) {
    if !s.bytes().any(|b| matches!(b, b'%' | b'|' | b'=')) {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '|' => out.push_str("%7C"),
            '=' => out.push_str("%3D"),
            c => out.push(c),
        }
    }
}

/// A key scoped by a policy's name (`<policy>:<key>`), so that two policies with equal rules
/// count separately; `<policy>:sha256:<hash of the whole>` when that would be too long.
pub fn policy_key(policy: &str, key: &str) -> String {
    // Pushed rather than format!ed: this runs on every check of the tower layer and the server.
    let mut full = String::with_capacity(policy.len() + 1 + key.len());
    full.push_str(policy);
    full.push(':');
    full.push_str(key);
    if full.len() <= MAX_KEY_BYTES {
        full
    } else {
        format!("{policy}:sha256:{}", sha256_hex(full.as_bytes()))
    }
}

/// Calls `f` with [`policy_key`]`(policy, key)`, written into a buffer this thread keeps rather
/// than a new `String`: for a caller that needs the key only while it decides synchronously
/// (the tower layer on an in-process backend).
pub fn with_policy_key<R>(policy: &str, key: &str, f: impl FnOnce(&str) -> R) -> R {
    thread_local! {
        static BUFFER: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    BUFFER.with(|buffer| match buffer.try_borrow_mut() {
        Ok(mut full) if policy.len() + 1 + key.len() <= MAX_KEY_BYTES => {
            full.clear();
            full.push_str(policy);
            full.push(':');
            full.push_str(key);
            f(&full)
        }
        // Too long (hashed), or `f` itself asked for a key: a `String` of its own.
        _ => f(&policy_key(policy, key)),
    })
}

/// A secret (a header value, a bearer token) as it may appear in a key: the first 128 bits of
/// its SHA-256, in hex. Secrets must not land in a backend, and a key has a bounded length.
pub fn secret_digest(secret: &[u8]) -> String {
    let mut hex = sha256_hex(secret);
    hex.truncate(32);
    hex
}

/// The SHA-256 of `bytes`, in lower-case hex: the one hash behind every shortened key.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(64);
    for b in Sha256::digest(bytes) {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Escaping in one pass spells a key as the three replacements in turn would.
        #[test]
        fn envoy_keys_escape_as_the_replacements_did(
            domain in "[a-z%|=]{0,6}",
            entries in proptest::collection::vec(("[a-z%|=]{0,6}", "[a-zé%|=]{0,8}"), 0..4),
        ) {
            let escape = |s: &str| s.replace('%', "%25").replace('|', "%7C").replace('=', "%3D");
            let mut expected = format!("{ENVOY_PREFIX}{}", escape(&domain));
            for (k, v) in &entries {
                expected.push_str(&format!("|{}={}", escape(k), escape(v)));
            }
            let pairs: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            proptest::prop_assert_eq!(envoy_key(&domain, &pairs), expected);
        }
    }

    #[test]
    fn keys_keep_their_stored_spelling() {
        assert_eq!(consumer_key("c1"), "consumer:c1");
        assert_eq!(
            anonymous_key("203.0.113.9".parse::<std::net::IpAddr>().unwrap()),
            "anonymous:203.0.113.9"
        );
        assert_eq!(envoy_key("d", &[("k", "a|b=c%")]), "envoy:d|k=a%7Cb%3Dc%25");
        assert_eq!(policy_key("p", "k"), "p:k");
        assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(secret_digest(b"abc"), "ba7816bf8f01cfea414140de5dae2223");
    }

    #[test]
    fn long_keys_are_hashed_within_the_bound() {
        let long = "x".repeat(MAX_KEY_BYTES);
        let envoy = envoy_key("d", &[("k", long.as_str())]);
        assert!(envoy.starts_with(ENVOY_HASHED_PREFIX) && envoy.len() <= MAX_KEY_BYTES);
        let scoped = policy_key("p", &long);
        assert!(scoped.starts_with("p:sha256:") && scoped.len() <= MAX_KEY_BYTES);
    }

    #[test]
    fn a_key_in_the_kept_buffer_is_the_key_itself() {
        let at_bound = "x".repeat(MAX_KEY_BYTES - 2);
        let over = "x".repeat(MAX_KEY_BYTES - 1);
        for key in ["k", "", &at_bound, &over, "y"] {
            with_policy_key("p", key, |scoped| assert_eq!(scoped, policy_key("p", key)));
        }
        assert_eq!(with_policy_key("p", &at_bound, str::len), MAX_KEY_BYTES);
        // A key asked for while another is in use is its own.
        with_policy_key("p", "outer", |outer| {
            with_policy_key("q", "inner", |inner| assert_eq!(inner, "q:inner"));
            assert_eq!(outer, "p:outer");
        });
    }

    #[test]
    fn reserved_prefixes_are_found() {
        assert_eq!(reserved_prefix("consumer:x"), Some(CONSUMER_PREFIX));
        assert_eq!(reserved_prefix("envoy#abc"), Some(ENVOY_HASHED_PREFIX));
        assert_eq!(reserved_prefix("user:1"), None);
    }
}
