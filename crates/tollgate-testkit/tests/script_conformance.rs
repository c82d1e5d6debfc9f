//! The shared scenarios on `tollgate_core::script::execute` (the engine as a Redis module runs
//! it), over an in-process store shaped as Redis is.

tollgate_testkit::conformance_tests!(tollgate_testkit::ScriptBackend::with_clock);
