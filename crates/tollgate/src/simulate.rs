//! `tollgate simulate`: its arguments and machinery are [`tollgate_simulate`]'s; the command
//! only mounts them.

pub use tollgate_simulate::{SimulateArgs, run};
