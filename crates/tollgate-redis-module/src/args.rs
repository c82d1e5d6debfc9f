//! `TOLLGATE.DECIDE`'s arguments split as `EVALSHA`'s are: `numkeys`, that many keys, then the
//! script's `ARGV`. Pure, so that the checks that keep bad input from reaching the engine are
//! tested without a server.

/// Why the arguments cannot be split. The messages are `EVALSHA`'s own for the same faults, so a
/// client that handles the script's errors handles these.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// `numkeys` is not a decimal integer that fits an `i64`.
    #[error("ERR value is not an integer or out of range")]
    NotAnInteger,
    /// `numkeys` is negative.
    #[error("ERR Number of keys can't be negative")]
    Negative,
    /// `numkeys` counts more keys than there are arguments after it.
    #[error("ERR Number of keys can't be greater than number of args")]
    TooMany,
    /// No `numkeys` at all (Redis's arity check catches this first; kept for a direct call).
    #[error("ERR wrong number of arguments for 'tollgate.decide' command")]
    Arity,
}

/// The keys and `ARGV` of a call.
#[derive(Debug, PartialEq, Eq)]
pub struct Split<'a, T> {
    /// The keys (`KEYS`).
    pub keys: &'a [T],
    /// The arguments after them (`ARGV`).
    pub argv: &'a [T],
}

/// Splits `args`, the arguments after the command's name, at `numkeys` (the first).
pub fn split<T: AsRef<[u8]>>(args: &[T]) -> Result<Split<'_, T>, SplitError> {
    let (numkeys, rest) = args.split_first().ok_or(SplitError::Arity)?;
    let count = parse_count(numkeys.as_ref())?;
    if count > rest.len() {
        return Err(SplitError::TooMany);
    }
    let (keys, argv) = rest.split_at(count);
    Ok(Split { keys, argv })
}

/// `numkeys` as Redis reads an integer: optional `-`, decimal digits, no sign `+`, no spaces,
/// no leading zeros beyond a lone `0`, within `i64`.
fn parse_count(text: &[u8]) -> Result<usize, SplitError> {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    let canonical = !digits.is_empty()
        && digits.iter().all(u8::is_ascii_digit)
        && (digits.len() == 1 || digits[0] != b'0')
        && !(text.len() != digits.len() && digits == b"0");
    if !canonical {
        return Err(SplitError::NotAnInteger);
    }
    // ASCII digits, so valid UTF-8; out of i64's range is Redis's "out of range".
    let value: i64 =
        std::str::from_utf8(text).ok().and_then(|t| t.parse().ok()).ok_or(SplitError::NotAnInteger)?;
    if value < 0 {
        return Err(SplitError::Negative);
    }
    // A count above usize::MAX is above any argument count too.
    usize::try_from(value).map_err(|_| SplitError::TooMany)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_text(args: &[&str]) -> Result<(Vec<String>, Vec<String>), SplitError> {
        let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        let owned = |part: &[&[u8]]| part.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect();
        split(&bytes).map(|s| (owned(s.keys), owned(s.argv)))
    }

    #[test]
    fn numkeys_splits_keys_from_argv() {
        let (keys, argv) = split_text(&["2", "a", "b", "x", "y"]).unwrap();
        assert_eq!((keys, argv), (vec!["a".into(), "b".into()], vec!["x".into(), "y".into()]));
        let (keys, argv) = split_text(&["0", "x"]).unwrap();
        assert_eq!((keys.len(), argv.len()), (0, 1));
        let (keys, argv) = split_text(&["2", "a", "b"]).unwrap();
        assert_eq!((keys.len(), argv.len()), (2, 0));
        let (keys, argv) = split_text(&["0"]).unwrap();
        assert_eq!((keys.len(), argv.len()), (0, 0));
    }

    #[test]
    fn a_bad_numkeys_is_refused_as_evalsha_refuses_it() {
        assert_eq!(split_text(&[]), Err(SplitError::Arity));
        assert_eq!(split_text(&["3", "a", "b"]), Err(SplitError::TooMany));
        assert_eq!(split_text(&["-1", "a"]), Err(SplitError::Negative));
        assert_eq!(split_text(&["-9223372036854775808"]), Err(SplitError::Negative));
        assert_eq!(split_text(&["9223372036854775807", "a"]), Err(SplitError::TooMany));
        for bad in ["", "x", "1x", " 1", "1 ", "+1", "01", "-0", "-", "1.0", "9223372036854775808", "١"] {
            assert_eq!(split_text(&[bad, "a"]), Err(SplitError::NotAnInteger), "{bad:?}");
        }
    }

    #[test]
    fn the_messages_carry_an_error_code() {
        for e in [SplitError::NotAnInteger, SplitError::Negative, SplitError::TooMany, SplitError::Arity] {
            assert!(e.to_string().starts_with("ERR "), "{e}");
        }
    }
}
