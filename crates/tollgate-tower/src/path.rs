//! Canonical request paths. Routes are matched on one spelling of each path, so that
//! `//login`, `/./login`, `/%6Cogin`, `/x/../login` or `/login;x` cannot miss the `/login`
//! route's policy while the service behind serves them as `/login` (as nginx, Spring, werkzeug
//! and Python's http.server do).
//!
//! The canonical form of a path (RFC 3986 6.2.2, plus what servers disagree on):
//!
//! - percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`, RFC 3986 2.3) are decoded
//!   (`%6C` is `l`, `%2e` is `.`); every other escape stays encoded, its hex digits upper-case;
//! - characters a path may not hold raw (non-ASCII, `"`, `{`, `|`, ...) are percent-encoded;
//! - `;` path parameters are dropped from every segment (`/login;jsessionid=1` is `/login`,
//!   `/..;/login` is `/../login`), as servlet containers do before routing;
//! - empty segments are merged (`//login` is `/login`), then dot segments are resolved
//!   (RFC 3986 5.2.4; `..` above the root stays at the root); a trailing `/` is kept.
//!
//! Refused outright (400), because servers disagree on what they mean and no single canonical
//! form is right for all of them: `%2F` (an encoded `/`: a segment separator to some, a
//! character to others), `\` and `%5C` (read as `/` by Windows servers and some frameworks),
//! `%25` (an encoded `%`: a server that decodes twice reads `%256C` as `l`), control
//! characters (`%00` to `%1F`, `%7F`), `%` without two hex digits, and escapes that do not
//! decode to UTF-8 (`%ff`, the overlong `%c0%af`).
//!
//! Matching then ignores a trailing `/` (`/login/` takes `/login`'s route: Spring before 6,
//! among others, serves one as the other) and, under [`PathCase::Insensitive`], ASCII case.

use std::borrow::Cow;

use serde::Deserialize;

/// What the layer does with a request whose path is not in canonical form (see the
/// [module](crate#canonical-paths)).
///
/// Either way a path can no longer be spelled to miss its route: under `Normalize` the service
/// behind receives the very path the route was chosen for, under `Reject` only canonical paths
/// pass at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NonCanonicalPaths {
    /// Match on the canonical form and replace the request's path with it (the query is kept
    /// as sent), so the service, or `tollgate proxy`'s upstream, gets what was matched. The
    /// default: clients that spell paths loosely (`//` from joined strings) keep working.
    #[default]
    Normalize,
    /// Refuse with 400 (problem+json naming `path`, with the canonical form in `detail`).
    /// Escapes differing only in the case of their hex digits (`%c3%a9`) are not refused.
    Reject,
}

/// Whether routes match paths case-sensitively.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathCase {
    /// `/LOGIN` is not `/login` (the default, as in RFC 3986 and most servers).
    #[default]
    Sensitive,
    /// ASCII letters match in either case: for services that serve `/LOGIN` as `/login`
    /// (IIS, case-insensitive file systems, some frameworks' options). The path is passed on
    /// in the case it was sent.
    Insensitive,
}

/// Why a request path is refused (400, problem+json naming `path`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// A `%` not followed by two hexadecimal digits (`%zz`, a trailing `%`).
    #[error("the path's `%` at byte {offset} is not followed by two hexadecimal digits")]
    InvalidEscape {
        /// Where the `%` is, in bytes from the path's start.
        offset: usize,
    },
    /// `%2F`: a segment separator to some servers, a character to others.
    #[error(
        "the path holds %2F (an encoded `/`), which is refused: servers disagree on whether it separates segments"
    )]
    EncodedSlash,
    /// A raw `\`: Windows servers and some frameworks read it as `/`.
    #[error("the path holds a backslash, which is refused: some servers read it as `/`")]
    Backslash,
    /// `%5C`: an encoded `\`.
    #[error("the path holds %5C (an encoded backslash), which is refused: some servers read it as `/`")]
    EncodedBackslash,
    /// `%25`: an encoded `%`, which a server that decodes twice reads as the start of an escape.
    #[error(
        "the path holds %25 (an encoded `%`), which is refused: a server that decodes twice would read another path"
    )]
    EncodedPercent,
    /// A control character, raw or encoded (`%00` to `%1F`, `%7F`).
    #[error("the path holds the control character 0x{byte:02X}, which is refused")]
    ControlCharacter {
        /// The character.
        byte: u8,
    },
    /// Escapes that do not decode to UTF-8 (`%ff`, overlong forms such as `%c0%af`).
    #[error("the path's escapes do not decode to UTF-8")]
    NotUtf8,
    /// Not in canonical form, under [`NonCanonicalPaths::Reject`].
    #[error(
        "the path is not in canonical form (no `//`, `.` or `..` segments, `;` parameters or needless escapes); send {canonical:?}"
    )]
    NotCanonical {
        /// The path's canonical form.
        canonical: String,
    },
}

/// Whose spelling is canonicalised: a request's, or a route pattern's (which keeps matchit's
/// `{param}` braces raw).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spelling {
    Request,
    Pattern,
}

/// Unreserved characters (RFC 3986 2.3): decoded from escapes, never encoded.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Characters a canonical segment holds raw besides the unreserved ones: sub-delims, `:` and
/// `@` (RFC 3986 3.3 `pchar`). `;` never reaches here (parameters are dropped first).
fn is_other_pchar(b: u8) -> bool {
    matches!(b, b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b'=' | b':' | b'@')
}

fn hex_value(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

fn push_escape(out: &mut String, b: u8) {
    out.push('%');
    out.push(char::from(HEX_UPPER[usize::from(b >> 4)]));
    out.push(char::from(HEX_UPPER[usize::from(b & 0xf)]));
}

/// One segment (between `/`s, parameters already cut off) in canonical spelling. `offset` is
/// the segment's position in the path, for errors.
fn canonical_segment(segment: &str, offset: usize, spelling: Spelling) -> Result<String, PathError> {
    let bytes = segment.as_bytes();
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let value = bytes
                .get(i + 1..i + 3)
                .and_then(|h| Some(hex_value(h[0])? << 4 | hex_value(h[1])?))
                .ok_or(PathError::InvalidEscape { offset: offset + i })?;
            match value {
                b'/' => return Err(PathError::EncodedSlash),
                b'\\' => return Err(PathError::EncodedBackslash),
                b'%' => return Err(PathError::EncodedPercent),
                v if v < 0x20 || v == 0x7f => return Err(PathError::ControlCharacter { byte: v }),
                v if is_unreserved(v) => out.push(char::from(v)),
                v => push_escape(&mut out, v),
            }
            i += 3;
            continue;
        }
        match b {
            b'\\' => return Err(PathError::Backslash),
            b if b < 0x20 || b == 0x7f => return Err(PathError::ControlCharacter { byte: b }),
            b'{' | b'}' if spelling == Spelling::Pattern => out.push(char::from(b)),
            b if is_unreserved(b) || is_other_pchar(b) => out.push(char::from(b)),
            // Non-ASCII (the bytes of UTF-8), and ASCII a path may not hold raw.
            b => push_escape(&mut out, b),
        }
        i += 1;
    }
    // The decoded segment must be text: a lenient decoder downstream could read invalid or
    // overlong UTF-8 (`%c0%af`) as `/` or `.`.
    if std::str::from_utf8(&percent_encoding::percent_decode_str(&out).collect::<Vec<u8>>()).is_err() {
        return Err(PathError::NotUtf8);
    }
    Ok(out)
}

/// Whether `path` is canonical at a glance: only unreserved characters, sub-delims, `:`, `@`
/// and single `/`s, and no dot segments. Most paths are, and skip the work below.
fn is_plainly_canonical(path: &str) -> bool {
    path.starts_with('/')
        && path.bytes().all(|b| b == b'/' || is_unreserved(b) || is_other_pchar(b))
        && !path.contains("//")
        && !path.split('/').any(|segment| segment == "." || segment == "..")
}

/// The canonical form of `path` (see the module's documentation); borrowed when `path` is
/// already canonical. The asterisk form (`OPTIONS *`) is its own canonical form.
pub(crate) fn canonicalize(path: &str, spelling: Spelling) -> Result<Cow<'_, str>, PathError> {
    if path == "*" || is_plainly_canonical(path) {
        return Ok(Cow::Borrowed(path));
    }
    let rest = path.strip_prefix('/').unwrap_or(path);
    let mut segments: Vec<String> = Vec::new();
    let mut trailing_slash = false;
    let mut offset = path.len() - rest.len();
    for raw in rest.split('/') {
        // Parameters go first, so `..;x` is `..` (as servlet containers read it).
        let cut = raw.find(';').unwrap_or(raw.len());
        let segment = canonical_segment(&raw[..cut], offset, spelling)?;
        offset += raw.len() + 1;
        trailing_slash = matches!(segment.as_str(), "" | "." | "..");
        match segment.as_str() {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(segment),
        }
    }
    let mut canonical = String::with_capacity(path.len());
    for segment in &segments {
        canonical.push('/');
        canonical.push_str(segment);
    }
    if trailing_slash || segments.is_empty() {
        canonical.push('/');
    }
    Ok(if canonical == path { Cow::Borrowed(path) } else { Cow::Owned(canonical) })
}

/// `path` with the hex digits of its escapes upper-cased: what a path differing from its
/// canonical form only in their case is equal to.
pub(crate) fn upper_case_escapes(path: &str) -> Cow<'_, str> {
    if !path.contains('%') {
        return Cow::Borrowed(path);
    }
    let mut out = path.as_bytes().to_vec();
    let mut i = 0;
    while i < out.len() {
        if out[i] == b'%' {
            for b in out.iter_mut().skip(i + 1).take(2) {
                b.make_ascii_uppercase();
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    // Only ASCII letters changed, so the bytes are still the path's UTF-8.
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// What routes are matched on: a canonical path without its trailing `/` (but `/` itself),
/// folded to lower case under [`PathCase::Insensitive`].
pub(crate) fn route_key(canonical: &str, case: PathCase) -> Cow<'_, str> {
    let trimmed = match canonical.strip_suffix('/') {
        Some(t) if !t.is_empty() => t,
        _ => canonical,
    };
    match case {
        PathCase::Insensitive if trimmed.bytes().any(|b| b.is_ascii_uppercase()) => {
            Cow::Owned(trimmed.to_ascii_lowercase())
        }
        _ => Cow::Borrowed(trimmed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(path: &str) -> Result<String, PathError> {
        canonicalize(path, Spelling::Request).map(Cow::into_owned)
    }

    #[test]
    fn spellings_of_one_path_have_one_canonical_form() {
        for spelling in [
            "/login",
            "//login",
            "///login",
            "/./login",
            "/%6Cogin",
            "/%6cogin",
            "/x/../login",
            "/login;x",
            "/login;x=1;y",
            "/%2e/login",
            "/x/%2e%2e/login",
            "/x/%2E%2E/login",
            "/x/.%2e/login",
            "/../login",
            "/../../../../login",
            "/..;/login",
            "/x;/../login",
            "/;x/login",
            "/a//../login",
            "/%6C%6F%67%69%6E",
        ] {
            assert_eq!(canon(spelling).as_deref(), Ok("/login"), "{spelling}");
        }
    }

    #[test]
    fn trailing_slashes_and_roots() {
        assert_eq!(canon("/").unwrap(), "/");
        assert_eq!(canon("//").unwrap(), "/");
        assert_eq!(canon("/..").unwrap(), "/");
        assert_eq!(canon("/login/").unwrap(), "/login/");
        assert_eq!(canon("/login//").unwrap(), "/login/");
        assert_eq!(canon("/login/.").unwrap(), "/login/");
        assert_eq!(canon("/a/b/..").unwrap(), "/a/");
        assert_eq!(canon("/login/;x").unwrap(), "/login/");
        assert_eq!(canon("*").unwrap(), "*");
        assert_eq!(route_key("/login/", PathCase::Sensitive), "/login");
        assert_eq!(route_key("/", PathCase::Sensitive), "/");
        assert_eq!(route_key("/LOGIN/", PathCase::Insensitive), "/login");
        assert_eq!(route_key("/LOGIN", PathCase::Sensitive), "/LOGIN");
    }

    #[test]
    fn other_escapes_stay_encoded_and_raw_outsiders_are_encoded() {
        assert_eq!(canon("/caf%c3%a9").unwrap(), "/caf%C3%A9");
        assert_eq!(canon("/café").unwrap(), "/caf%C3%A9");
        assert_eq!(canon("/a%3Bb").unwrap(), "/a%3Bb");
        assert_eq!(canon("/a%3fb").unwrap(), "/a%3Fb");
        assert_eq!(canon("/a%20b").unwrap(), "/a%20b");
        assert_eq!(canon("/a\"b{c}|").unwrap(), "/a%22b%7Bc%7D%7C");
        assert_eq!(canon("/a%7eb%41").unwrap(), "/a~bA");
        assert_eq!(canon("/user@x:1!$&'()*+,=").unwrap(), "/user@x:1!$&'()*+,=");
        // Already canonical: borrowed, no allocation.
        assert!(matches!(canonicalize("/api/v1/users/42", Spelling::Request), Ok(Cow::Borrowed(_))));
        // Patterns keep matchit's braces.
        assert_eq!(canonicalize("/users/{id}", Spelling::Pattern).unwrap(), "/users/{id}");
        assert_eq!(canonicalize("/s/{*rest}", Spelling::Pattern).unwrap(), "/s/{*rest}");
    }

    #[test]
    fn ambiguous_spellings_are_refused() {
        assert_eq!(canon("/%2Flogin"), Err(PathError::EncodedSlash));
        assert_eq!(canon("/a%2fb"), Err(PathError::EncodedSlash));
        assert_eq!(canon("/a\\..\\login"), Err(PathError::Backslash));
        assert_eq!(canon("/a%5c..%5Clogin"), Err(PathError::EncodedBackslash));
        assert_eq!(canon("/%256Cogin"), Err(PathError::EncodedPercent));
        assert_eq!(canon("/login%00"), Err(PathError::ControlCharacter { byte: 0 }));
        assert_eq!(canon("/login%0d%0a"), Err(PathError::ControlCharacter { byte: 0x0d }));
        assert_eq!(canon("/login%7F"), Err(PathError::ControlCharacter { byte: 0x7f }));
        assert_eq!(canon("/a/%zz"), Err(PathError::InvalidEscape { offset: 3 }));
        assert_eq!(canon("/a/b%"), Err(PathError::InvalidEscape { offset: 4 }));
        assert_eq!(canon("/a/b%4"), Err(PathError::InvalidEscape { offset: 4 }));
        assert_eq!(canon("/%ff"), Err(PathError::NotUtf8));
        assert_eq!(canon("/%c0%af"), Err(PathError::NotUtf8));
        assert_eq!(canon("/%c0%ae%c0%ae/login"), Err(PathError::NotUtf8));
        // Refused even inside a parameter? No: parameters are dropped unread.
        assert_eq!(canon("/login;%2F").unwrap(), "/login");
    }

    #[test]
    fn escapes_are_compared_without_their_hex_case() {
        assert_eq!(upper_case_escapes("/caf%c3%a9/x"), "/caf%C3%A9/x");
        assert_eq!(upper_case_escapes("/plain"), "/plain");
        assert_eq!(upper_case_escapes("/end%"), "/end%");
    }

    /// A server's reading of a path, as the lenient ones do it: parameters cut from each
    /// segment, every escape decoded, empty and `.` segments dropped, `..` going up.
    fn served_as(path: &str) -> Vec<Vec<u8>> {
        let mut segments: Vec<Vec<u8>> = Vec::new();
        for raw in path.split('/') {
            let raw = raw.split(';').next().unwrap_or("");
            let decoded: Vec<u8> = percent_encoding::percent_decode_str(raw).collect();
            match decoded.as_slice() {
                b"" | b"." => {}
                b".." => {
                    segments.pop();
                }
                _ => segments.push(decoded),
            }
        }
        segments
    }

    proptest::proptest! {
        /// Whatever the spelling: the canonical form is its own canonical form, holds no `//`,
        /// dot segment or parameter, and a lenient server serves it as it serves the original.
        #[test]
        fn the_canonical_form_is_stable_and_served_as_the_original(
            parts in proptest::collection::vec(
                proptest::sample::select(vec![
                    "/", "//", ".", "..", "%2e", "%2E", "%2e%2e", ";", ";x=1", "%6C", "%6c", "l", "L",
                    "og", "in", "%3B", "%41", "%c3%a9", "é", "~", "%7e", "!", "@", "%20", "\"", "{",
                ]),
                0..12,
            )
        ) {
            let path = format!("/{}", parts.concat());
            let canonical = canonicalize(&path, Spelling::Request).unwrap().into_owned();
            proptest::prop_assert!(matches!(canonicalize(&canonical, Spelling::Request), Ok(Cow::Borrowed(_))), "{canonical}");
            proptest::prop_assert!(!canonical.contains("//") && !canonical.contains(';'), "{canonical}");
            proptest::prop_assert!(!canonical.split('/').any(|s| s == "." || s == ".."), "{canonical}");
            proptest::prop_assert_eq!(served_as(&canonical), served_as(&path), "{} -> {}", path, canonical);
        }
    }

    #[test]
    fn long_paths_are_linear() {
        let long = format!("/{}login", "a/../".repeat(12_000));
        assert_eq!(canon(&long).unwrap(), "/login");
        let deep = format!("{}/login", "/x".repeat(30_000));
        assert_eq!(canon(&deep).unwrap().len(), deep.len());
    }
}
