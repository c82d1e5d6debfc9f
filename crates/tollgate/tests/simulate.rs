//! `tollgate simulate`: the admitted counts it reports are the ones the algorithms' definitions
//! give, and the ones `tollgate-core`'s own tests and the conformance scenarios
//! (`tollgate-testkit/src/conformance.rs`) establish for the same request sequences; the chart
//! has a panel per rule; mistakes are clear errors, never panics.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate")).arg("simulate").args(args).output().unwrap()
}

/// Runs `tollgate simulate --json` with `args`; its report.
fn simulate(args: &[&str]) -> Value {
    let out = run(&[args, &["--json"]].concat());
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The report's entry for the rule labelled `label`.
fn rule<'a>(report: &'a Value, label: &str) -> &'a Value {
    let rules = report["rules"].as_array().unwrap();
    rules.iter().find(|r| r["label"] == label).unwrap_or_else(|| panic!("no rule {label:?} in {report}"))
}

fn n(value: &Value, field: &str) -> u64 {
    value[field].as_u64().unwrap_or_else(|| panic!("no {field} in {value}"))
}

/// Requests admitted per bucket.
fn per_bucket(value: &Value) -> Vec<u64> {
    value["admitted_per_bucket"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect()
}

#[test]
fn steady_overload_admits_what_each_algorithm_defines() {
    // 50 a second, one every 20 ms, for 10 s, against 10 a second.
    let report = simulate(&[
        "--rules",
        "fixed_window 10/1s, sliding_window_log 10/1s, sliding_window_counter 10/1s",
        "--rules",
        "token_bucket 10/1s",
        "--rules",
        "gcra 10/1s burst=3",
        "--traffic",
        "steady:50/s",
        "--duration",
        "10s",
        "--bucket",
        "1s",
    ]);
    assert_eq!(n(&report, "requests"), 500);
    assert_eq!(report["bucket_s"], 1.0);
    for entry in report["rules"].as_array().unwrap() {
        assert_eq!(n(entry, "requests"), 500, "{entry}");
        assert_eq!(n(entry, "admitted") + n(entry, "denied"), 500, "{entry}");
        assert_eq!(per_bucket(entry).iter().sum::<u64>(), n(entry, "admitted"), "{entry}");
        assert_eq!(per_bucket(entry).len(), 10);
    }
    // Fixed window: the limit in each of the 10 clock windows (simulated time 0 is a window edge).
    let fixed = rule(&report, "fixed_window 10/1s");
    assert_eq!(n(fixed, "admitted"), 100);
    assert_eq!(per_bucket(fixed), [10; 10]);
    assert_eq!(n(fixed, "max_admitted_1s"), 10);
    // Sliding log: exactly the limit in every sliding second, and 10 in each.
    let log = rule(&report, "sliding_window_log 10/1s");
    assert_eq!((n(log, "admitted"), n(log, "max_admitted_window")), (100, 10));
    // Sliding counter: never more than the limit in a clock window (here, under it: the
    // previous window's weight holds the next one back).
    let counter = rule(&report, "sliding_window_counter 10/1s");
    assert!(per_bucket(counter).iter().all(|&admitted| admitted <= 10), "{counter}");
    assert_eq!(per_bucket(counter)[0], 10);
    // Token bucket and GCRA: the bucket at once, then one per emission interval (100 ms), so
    // capacity + floor(9.98 s / 100 ms) by the last request at 9.98 s: 10 + 99 and 3 + 99.
    let bucket = rule(&report, "token_bucket 10/1s");
    assert_eq!(n(bucket, "admitted"), 109);
    assert_eq!(n(bucket, "max_admitted_1s"), 19, "a full bucket plus a second of refill, less one");
    let gcra = rule(&report, "gcra 10/1s burst=3");
    assert_eq!(n(gcra, "admitted"), 102);
    assert_eq!(per_bucket(gcra)[1..], [10; 9], "smooth: the sustained rate in every second after the first");
}

/// The conformance scenarios both backends pass, replayed as traffic: same rules, same request
/// times, same counts.
#[test]
fn the_conformance_scenarios_count_the_same() {
    // sliding_window_log_is_exact: attempts every 10 ms for 3 s, never more than 3 in any
    // second, 9 in all.
    let report =
        simulate(&["--rules", "sliding_window_log 3/1s", "--traffic", "steady:100/s", "--duration", "3s"]);
    let log = rule(&report, "sliding_window_log 3/1s");
    assert_eq!((n(log, "requests"), n(log, "admitted"), n(log, "max_admitted_1s")), (300, 9, 3));

    // token_bucket_refills_exactly: one token a second, 301 attempts 10 ms apart: 4 admitted,
    // at 0, 1, 2 and 3 s.
    let report =
        simulate(&["--rules", "token_bucket 1/1s", "--traffic", "steady:100/s", "--duration", "3s 10ms"]);
    let bucket = rule(&report, "token_bucket 1/1s");
    assert_eq!((n(bucket, "requests"), n(bucket, "admitted")), (301, 4));

    // gcra_spacing_and_burst: 3 at once, then one every 100 ms: 3 + 19 in 2 s of 10 ms attempts.
    let report =
        simulate(&["--rules", "gcra 10/1s burst=3", "--traffic", "steady:100/s", "--duration", "2s"]);
    assert_eq!(n(rule(&report, "gcra 10/1s burst=3"), "admitted"), 22);

    // fixed_window_clock_edges: a full window 1 ms before the edge and another at it:
    // 6 = 2 x limit within 1 ms. The sliding log, on the same requests, admits the limit.
    let report = simulate(&[
        "--rules",
        "fixed_window 3/1s, sliding_window_log 3/1s",
        "--traffic",
        "burst:3@999ms+burst:3@1s",
        "--duration",
        "2s",
    ]);
    let fixed = rule(&report, "fixed_window 3/1s");
    assert_eq!((n(fixed, "admitted"), n(fixed, "max_admitted_1s")), (6, 6));
    let log = rule(&report, "sliding_window_log 3/1s");
    assert_eq!((n(log, "admitted"), n(log, "max_admitted_1s")), (3, 3));

    // sliding_window_counter_weights_previous_window: 10 in the first window; 250 ms into the
    // next the previous 10 weigh 7.5, so 2 of 3 fit; one more fits 50 ms later, not 1 ms before.
    let report = simulate(&[
        "--rules",
        "sliding_window_counter 10/1s",
        "--traffic",
        "burst:10@0s+burst:3@1250ms+burst:1@1299ms+burst:1@1300ms",
        "--duration",
        "2s",
        "--bucket",
        "50ms",
    ]);
    let counter = rule(&report, "sliding_window_counter 10/1s");
    assert_eq!((n(counter, "requests"), n(counter, "admitted")), (15, 13));
    let admitted = per_bucket(counter);
    assert_eq!((admitted[0], admitted[25], admitted[26]), (10, 2, 1), "buckets at 0, 1250 and 1300 ms");
}

#[test]
fn the_double_burst_at_a_window_edge() {
    // A client idle for most of a minute sends 100 just before the edge and 100 just after.
    let report = simulate(&[
        "--rules",
        "fixed_window 100/1m, sliding_window_log 100/1m, sliding_window_counter 100/1m",
        "--rules",
        "token_bucket 100/1m, gcra 100/1m burst=10",
        "--traffic",
        "burst:100@59s+burst:100@1m1s",
        "--duration",
        "2m",
    ]);
    let counts = |label: &str| {
        let entry = rule(&report, label);
        (n(entry, "admitted"), n(entry, "max_admitted_window"))
    };
    // Fixed window: each window admits its limit, so 2 x limit within 2 s.
    assert_eq!(counts("fixed_window 100/1m"), (200, 200));
    assert_eq!(rule(&report, "fixed_window 100/1m")["window_s"], 60.0);
    // Sliding log: never more than the limit in any minute.
    assert_eq!(counts("sliding_window_log 100/1m"), (100, 100));
    // Sliding counter: 1 s into the next window the previous 100 weigh 100 x 59/60 = 98.3,
    // so one more fits.
    assert_eq!(counts("sliding_window_counter 100/1m"), (101, 101));
    // Token bucket and GCRA: what is in the bucket, then 2 s of refill at 100 a minute (3.3).
    assert_eq!(counts("token_bucket 100/1m"), (103, 103));
    assert_eq!(counts("gcra 100/1m burst=10"), (13, 13));
}

#[test]
fn random_traffic_never_puts_more_than_the_limit_in_a_sliding_log_minute() {
    // Poisson arrivals averaging 3 times the limit, for 10 minutes (seeded: the same every run).
    let report = simulate(&[
        "--rules",
        "fixed_window 100/1m, sliding_window_log 100/1m",
        "--traffic",
        "poisson:300/m",
        "--duration",
        "10m",
    ]);
    let requests = n(&report, "requests");
    assert!((2_800..3_200).contains(&requests), "{requests} requests for 3000 expected");
    let log = rule(&report, "sliding_window_log 100/1m");
    assert_eq!(n(log, "max_admitted_window"), 100);
    // The fixed window spends every window's limit, and across edges goes over it.
    let fixed = rule(&report, "fixed_window 100/1m");
    assert_eq!(n(fixed, "admitted"), 1_000);
    let max = n(fixed, "max_admitted_window");
    assert!(max > 100 && max <= 200, "{max}");
    assert_eq!(
        report,
        simulate(&[
            "--rules",
            "fixed_window 100/1m, sliding_window_log 100/1m",
            "--traffic",
            "poisson:300/m",
            "--duration",
            "10m",
        ]),
        "the same traffic on every run"
    );
}

#[test]
fn a_csv_file_gives_keys_and_costs() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("traffic.csv");
    // Each key has its own limit; a request of cost 2 needs two units.
    std::fs::write(
        &csv,
        "offset,key,cost\n0,alice\n0,alice\n0.1,alice\n0,bob\n0.5,bob,2\n1.5,bob,2\n9,bob\n",
    )
    .unwrap();
    let report =
        simulate(&["--rules", "fixed_window 2/1s", "--traffic", csv.to_str().unwrap(), "--duration", "2s"]);
    assert_eq!((n(&report, "requests"), n(&report, "keys"), n(&report, "dropped")), (6, 2, 1));
    let fixed = rule(&report, "fixed_window 2/1s");
    // alice: 2 of 3; bob: 1, not the cost-2 request in the same second, then the one at 1.5 s.
    assert_eq!((n(fixed, "admitted"), n(fixed, "denied"), n(fixed, "admitted_units")), (4, 2, 5));
    assert_eq!(n(fixed, "max_admitted_1s"), 2, "per key");
}

#[test]
fn the_chart_has_one_panel_per_rule_and_the_table_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("chart.svg");
    let labels = ["fixed_window 100/1m", "sliding_window_counter 100/1m", "gcra 100/1m burst=10"];
    let out = run(&[
        "--rules",
        &labels.join(","),
        "--rules",
        "token_bucket 100/1m name=bucket",
        "--traffic",
        "steady:3/s",
        "--duration",
        "3m",
        "--out",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("steady:3/s for 3m: 540 requests"), "{table}");
    assert!(table.contains("(90 buckets of 2s)"), "the default bucket: {table}");
    for label in labels.iter().chain(&["bucket"]) {
        assert!(table.lines().any(|line| line.starts_with(label)), "{label} in\n{table}");
    }

    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg"), "{}", &chart[..chart.len().min(200)]);
    assert!(chart.trim_end().ends_with("</svg>"));
    // A title per panel, and one caption per panel with its totals.
    for label in labels.iter().chain(&["bucket"]) {
        assert_eq!(chart.matches(&format!(">\n{label}\n</text>")).count(), 1, "{label}");
    }
    assert_eq!(chart.matches(" admitted, ").count(), 4);
    assert!(chart.contains(">\n300 admitted, 240 denied; at most 100 admitted in any 1m"), "fixed window");
    assert_eq!(chart.matches(">\nwindow edge\n</text>").count(), 2, "fixed window and counter only");
}

#[test]
fn a_day_of_simulated_traffic_takes_no_day() {
    let started = Instant::now();
    let report = simulate(&["--rules", "gcra 1/1s burst=1", "--traffic", "steady:2/s", "--duration", "1d"]);
    assert_eq!(n(rule(&report, "gcra 1/1s burst=1"), "admitted"), 86_400);
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
}

#[test]
fn mistakes_are_clear_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let bad_csv = dir.path().join("bad.csv");
    std::fs::write(&bad_csv, "0\nsoon\n").unwrap();
    let missing_dir = dir.path().join("no/such/dir/chart.svg");
    let cases: [(&[&str], &str); 12] = [
        (&["--rules", "leaky 10/1s", "--traffic", "steady:5/s"], "unknown variant `leaky`"),
        (&["--rules", "gcra 10/1s", "--traffic", "steady:5/s"], "missing field `burst`"),
        (&["--rules", "fixed_window 0/1s", "--traffic", "steady:5/s"], "limit = 0 is out of range"),
        (&["--rules", "concurrency limit=2 lease=1s", "--traffic", "steady:5/s"], "replays checks only"),
        (&["--rules", "fixed_window 10/1s", "--traffic", "stedy:5/s"], "unknown traffic pattern `stedy:`"),
        (&["--rules", "fixed_window 10/1s", "--traffic", "burst:5"], "COUNT@TIME"),
        (&["--rules", "fixed_window 10/1s", "--traffic", "no-such-file.csv"], "cannot read traffic file"),
        (
            &["--rules", "fixed_window 10/1s", "--traffic", bad_csv.to_str().unwrap()],
            "bad.csv:2: invalid time",
        ),
        (&["--rules", "fixed_window 10/1s", "--traffic", "steady:5/s", "--bucket", "1ms"], "at most 2000"),
        (
            &["--rules", "fixed_window 10/1s", "--traffic", "steady:5/s,cost=20"],
            "cost 20 can never be admitted",
        ),
        (
            &["--rules", "fixed_window 10/1s", "--traffic", "steady:1000000/s", "--duration", "1h"],
            "more than",
        ),
        (
            &[
                "--rules",
                "fixed_window 10/1s",
                "--traffic",
                "steady:5/s",
                "--out",
                missing_dir.to_str().unwrap(),
            ],
            "writing the chart",
        ),
    ];
    for (args, expected) in cases {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// The report's `reserve` entry of a rule's run.
fn reserve<'a>(report: &'a Value, label: &str) -> &'a Value {
    let run = &rule(report, label)["reserve"];
    assert!(run.is_object(), "no reserve entry for {label:?} in {report}");
    run
}

/// `--reserve`: each rule twice, through the limiters, reservations off then on. A hot key under
/// its limit: everything admitted either way, with a small fraction of the backend calls, and
/// every reserved unit accounted for (admitted from a block, given back, or expired).
#[test]
fn reservations_spare_the_backend_on_a_hot_key() {
    let report = simulate(&[
        "--rules",
        "fixed_window 20000/1m, token_bucket 400/1s capacity=2000, gcra 400/1s burst=2000",
        "--traffic",
        "steady:200/s",
        "--duration",
        "2m",
        "--instances",
        "4",
        "--reserve",
        "auto",
    ]);
    assert_eq!(report["rules"].as_array().unwrap().len(), 6, "each rule off, then on");
    for label in ["fixed_window 20000/1m", "token_bucket 400/1s capacity=2000", "gcra 400/1s burst=2000"] {
        let (off, on) = (rule(&report, label), rule(&report, &format!("{label} reserve=auto")));
        assert_eq!((n(off, "admitted"), n(on, "admitted")), (24_000, 24_000), "{label}");
        let (off, on) = (reserve(&report, label), reserve(&report, &format!("{label} reserve=auto")));
        assert_eq!((off["reserve"].as_str(), on["reserve"].as_str()), (Some("off"), Some("auto")));
        assert_eq!(n(off, "instances"), 4);
        assert_eq!(n(off, "backend_calls"), 24_000, "{label}: one call per check without reservations");
        assert_eq!(n(off, "blocks"), 0);
        // A bucket's and GCRA's blocks last 1 s: a block and a refund per instance a second.
        assert!(n(on, "backend_calls") * 10 < 24_000, "{label}: {on}");
        assert!(n(on, "blocks") > 0 && n(on, "reserved_decisions") > 20_000, "{label}: {on}");
        // Cost 1: a unit of a block is admitted once, given back, or expired.
        assert_eq!(
            n(on, "reserved_units"),
            n(on, "reserved_decisions") + n(on, "returned") + n(on, "expired"),
            "{label}: {on}"
        );
    }
    // The window's units held when it ends cannot go back (they would count in the next one).
    let fixed = reserve(&report, "fixed_window 20000/1m reserve=auto");
    assert!(n(fixed, "expired") > 0 && n(fixed, "held_at_end") > 0, "{fixed}");
}

/// Under overload, with reservations, each minute of a fixed window still admits at most its
/// limit and at least the limit less the quarter the instances may hold idle; a token bucket
/// and GCRA admit no more than they do without reservations.
#[test]
fn reservations_never_admit_over_the_limit() {
    let report = simulate(&[
        "--rules",
        "fixed_window 1000/1m, token_bucket 10/1s capacity=500, gcra 10/1s burst=500",
        "--traffic",
        "steady:50/s+poisson:30/s",
        "--duration",
        "3m",
        "--bucket",
        "1m",
        "--instances",
        "3",
        "--reserve",
        "max=50",
    ]);
    let fixed = rule(&report, "fixed_window 1000/1m reserve=max=50");
    for admitted in per_bucket(fixed) {
        assert!((750..=1000).contains(&admitted), "{fixed}");
    }
    assert!(n(reserve(&report, "fixed_window 1000/1m reserve=max=50"), "blocks") > 0);
    for label in ["token_bucket 10/1s capacity=500", "gcra 10/1s burst=500"] {
        let (off, on) = (rule(&report, label), rule(&report, &format!("{label} reserve=max=50")));
        assert!(n(on, "admitted") <= n(off, "admitted"), "{label}: {on}");
        assert!(n(on, "admitted") * 4 >= n(off, "admitted") * 3, "{label}: {on}");
    }
}

#[test]
fn reserve_mistakes_are_clear_errors() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--rules", "fixed_window 10/1s, sliding_window_log 10/1s", "--reserve", "auto"],
            "--reserve auto: sliding_window_log 10/1s: reserve cannot be used with rules[0], a sliding_window_log rule",
        ),
        (&["--rules", "fixed_window 10/1s", "--reserve", "max=0"], "max must be at least 1"),
        (&["--rules", "fixed_window 10/1s", "--reserve", "yes"], "expected auto, max=N or off"),
        (&["--rules", "fixed_window 10/1s", "--instances", "3"], "--reserve"),
    ];
    for (args, expected) in cases {
        let out = run(&[args, &["--traffic", "steady:5/s"]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
