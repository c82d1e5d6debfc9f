//! `tollgate bench`: its arguments and machinery are [`tollgate_bench`]'s; the command only
//! mounts them.

pub use tollgate_bench::{BenchArgs, run};
