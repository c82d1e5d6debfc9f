//! The shared scenarios on the memory backend. They run here rather than in tollgate-core's
//! own tests because this crate depends on the core: a dev-dependency back from the core would
//! make a cycle (and build the core twice).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tollgate_core::{LeaseId, MemoryBackend, Operation, Period, Rule, RuleSet};
use tollgate_testkit::conformance::one_of_each;

tollgate_testkit::conformance_tests!(MemoryBackend::with_clock);

#[test]
fn exactly_the_limit_is_admitted_across_threads() {
    let y: Period = "1y".parse().unwrap();
    let backend = Arc::new(MemoryBackend::new());
    for rule in one_of_each(1000, y) {
        let rules = RuleSet::new([rule.clone(), Rule::fixed_window(3000, y)]).unwrap();
        let admitted = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..8 {
                let (backend, rules, admitted) = (&backend, &rules, &admitted);
                s.spawn(move || {
                    for _ in 0..625 {
                        let id = LeaseId::random();
                        let op = if rules.has_concurrency() {
                            Operation::Acquire { cost: 1, lease: &id }
                        } else {
                            Operation::Check { cost: 1 }
                        };
                        if backend.execute_now("one-key", rules, op).unwrap().allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.load(Ordering::Relaxed), 1000, "{rule:?}");
        let peek = backend.execute_now("one-key", &rules, Operation::Check { cost: 0 }).unwrap();
        assert_eq!(
            peek.outcomes(&rules).nth(1).map(|o| o.remaining()),
            Some(2000),
            "{rule:?}: the second rule consumed exactly as much"
        );
        backend.reset_now("one-key", &rules).unwrap();
    }
}
