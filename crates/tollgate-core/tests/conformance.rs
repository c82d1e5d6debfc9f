//! The shared conformance scenarios on the memory backend.

use tollgate_core::MemoryBackend;

tollgate_testkit::conformance_tests!(MemoryBackend::with_clock);
