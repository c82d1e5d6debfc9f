//! [`execute`]: a script call decided in Rust, over a [`Store`], for a Redis module.

use super::store::{Store, StoreError};

/// A call that cannot be decided.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// An argument is missing or malformed; `index` is its position in `argv` (from 0).
    #[error("ERR tollgate: argument {index}: {reason}")]
    Argument {
        /// The argument's position in `argv`, from 0.
        index: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The number of keys does not match the parts' rules.
    #[error("ERR tollgate: the parts name {expected} keys, the call gave {got}")]
    Keys {
        /// Keys the parts' rules need.
        expected: usize,
        /// Keys given.
        got: usize,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Decides a call given in the script's calling convention (`keys` and `argv` as the script
/// receives them: see the [module docs](super)) against `store`, and answers what the script
/// would: `now`, then per part and rule admitted, remaining, reset_after, retry_after. Nothing
/// is written unless every argument is valid and every state could be read.
pub fn execute(keys: &[&[u8]], argv: &[&[u8]], store: &mut impl Store) -> Result<Vec<i64>, CallError> {
    let _ = (keys, argv, store);
    Err(CallError::Argument { index: 0, reason: "not built yet" })
}
