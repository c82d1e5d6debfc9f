//! `--traffic`: request patterns written on the command line (or read from a CSV file), turned
//! into one sorted list of requests at simulated offsets.
//!
//! ```text
//! TRAFFIC  = PATTERN ("+" PATTERN)*
//! PATTERN  = steady:RATE[,OPTION]*     evenly spaced
//!          | poisson:RATE[,OPTION]*    random (exponential) gaps averaging RATE, seeded
//!          | burst:N@AT[,OPTION]*      N requests at once at AT
//!          | FILE.csv | csv:FILE       one request per line: offset[,key[,cost]]
//! RATE     = N/PERIOD                  50/s, 100/1m, 5/100ms (s, m, h, d alone mean one of them)
//! OPTION   = from=DUR | to=DUR         steady and poisson: only within [from, to)
//!          | every=DUR | to=DUR        burst: again every DUR, while before `to`
//!          | seed=N                    poisson: another random sequence
//!          | key=KEY | cost=N          the requests' key (default "sim") and cost (default 1)
//! ```
//!
//! Everything is computed in whole microseconds from offset zero; nothing sleeps.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, bail};

/// The key of requests that do not name one.
pub const DEFAULT_KEY: &str = "sim";

/// Most requests one run may replay: far more than any chart shows, and few enough that a
/// mistyped rate fails at once instead of filling memory.
pub const MAX_REQUESTS: usize = 10_000_000;

/// One request: when (microseconds from the start), for which key, at what cost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Microseconds from the start of the simulation.
    pub at: u64,
    /// Index into [`Requests::keys`].
    pub key: usize,
    /// Units asked for (at least 1).
    pub cost: u64,
}

/// The requests of a whole traffic spec, sorted by time, and the keys they name.
#[derive(Debug, Default)]
pub struct Requests {
    /// The requests, by time (stable: patterns in the order written at equal times).
    pub list: Vec<Request>,
    /// Distinct keys, in order of first mention.
    pub keys: Vec<String>,
    /// CSV requests at or after the end of the run, left out.
    pub dropped: usize,
    /// Where each key is in `keys` (a file may name many).
    index: HashMap<String, usize>,
}

impl Requests {
    fn key(&mut self, key: &str) -> usize {
        if let Some(&at) = self.index.get(key) {
            return at;
        }
        self.keys.push(key.to_owned());
        self.index.insert(key.to_owned(), self.keys.len() - 1);
        self.keys.len() - 1
    }

    fn push(&mut self, at: u64, key: usize, cost: u64) -> anyhow::Result<()> {
        if self.list.len() >= MAX_REQUESTS {
            bail!(
                "the traffic makes more than {MAX_REQUESTS} requests; lower the rate or shorten --duration"
            );
        }
        self.list.push(Request { at, key, cost });
        Ok(())
    }
}

/// A rate: `count` requests per `per` microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Requests per `per`.
    pub count: u64,
    /// The interval, in microseconds.
    pub per: u64,
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, format_micros(self.per))
    }
}

/// What one pattern generates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Evenly spaced requests.
    Steady(Rate),
    /// Exponentially distributed gaps averaging the rate, from a seeded generator.
    Poisson {
        /// The mean rate.
        rate: Rate,
        /// The generator's seed.
        seed: u64,
    },
    /// `count` requests at `at`, again every `every` if given.
    Burst {
        /// Requests per burst.
        count: u64,
        /// Offset of the first burst.
        at: u64,
        /// Interval between bursts.
        every: Option<u64>,
    },
    /// A CSV file: `offset[,key[,cost]]` per line.
    File(PathBuf),
}

/// One pattern with its options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern {
    /// What it generates.
    pub shape: Shape,
    /// Start of the active span (steady, poisson), microseconds.
    pub from: u64,
    /// End of the active span, exclusive (default: the end of the run).
    pub to: Option<u64>,
    /// The requests' key.
    pub key: String,
    /// The requests' cost.
    pub cost: u64,
}

/// A whole `--traffic` value: patterns merged into one stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Traffic {
    /// The patterns, in the order written.
    pub patterns: Vec<Pattern>,
    /// The text as given, for reports.
    pub text: String,
}

/// `12.5` (seconds) or a humantime duration (`250ms`, `1m30s`), in microseconds.
pub fn parse_offset(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("an empty time".into());
    }
    // A bare number is seconds, possibly fractional: what spreadsheets and loggers write.
    if text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let seconds: f64 = text.parse().map_err(|_| format!("invalid time {text:?}"))?;
        return Ok((seconds * 1e6).round() as u64);
    }
    let d = humantime::parse_duration(text).map_err(|e| {
        format!("invalid time {text:?}: {e} (write it like \"1.5\" seconds, \"250ms\", \"30s\" or \"1m30s\")")
    })?;
    u64::try_from(d.as_micros()).map_err(|_| format!("time {text:?} is too large"))
}

/// A duration for reports: `1m 30s`, `250ms`, `0s`.
pub fn format_micros(micros: u64) -> String {
    if micros == 0 {
        return "0s".into();
    }
    humantime::format_duration(Duration::from_micros(micros)).to_string()
}

fn parse_rate(text: &str) -> Result<Rate, String> {
    let (count, per) = text
        .split_once('/')
        .ok_or_else(|| format!("invalid rate {text:?}: write it as COUNT/PERIOD, like 50/s or 100/1m"))?;
    let count: u64 = count
        .trim()
        .parse()
        .map_err(|_| format!("invalid rate {text:?}: {count:?} is not a whole number of requests"))?;
    if count == 0 {
        return Err(format!("invalid rate {text:?}: the count must be at least 1"));
    }
    let per = per.trim();
    // `50/s` reads better than `50/1s`: a unit alone means one of it.
    let one = format!("1{per}");
    let unit_alone = per.bytes().all(|b| b.is_ascii_alphabetic()) && parse_offset(&one).is_ok();
    let per = parse_offset(if unit_alone { &one } else { per })
        .map_err(|e| format!("invalid rate {text:?}: {e}"))?;
    if per == 0 {
        return Err(format!("invalid rate {text:?}: the period must be above zero"));
    }
    Ok(Rate { count, per })
}

fn parse_pattern(text: &str) -> Result<Pattern, String> {
    let text = text.trim();
    let (kind, rest) = match text.split_once(':') {
        Some((kind, rest)) if !kind.is_empty() && kind.bytes().all(|b| b.is_ascii_alphabetic()) => {
            (kind, rest)
        }
        // No `word:` prefix: a file name (which may hold a colon further on).
        _ => ("csv", text),
    };
    let mut options = rest.split(',');
    let main = options.next().unwrap_or_default().trim();
    let (shape, allowed) = match kind {
        "csv" if rest.is_empty() => return Err("csv: needs a file name".into()),
        // The whole rest is the file name, commas included.
        "csv" => (Shape::File(PathBuf::from(rest)), &[][..]),
        _ => parse_shape(kind, main)?,
    };
    let mut pattern = Pattern { shape, from: 0, to: None, key: DEFAULT_KEY.into(), cost: 1 };
    if let Shape::File(_) = pattern.shape {
        return Ok(pattern);
    }
    for option in options {
        let option = option.trim();
        let (name, value) = option
            .split_once('=')
            .ok_or_else(|| format!("invalid option {option:?} in {text:?}: write it as NAME=VALUE"))?;
        let (name, value) = (name.trim(), value.trim());
        if !allowed.contains(&name) {
            return Err(format!("{kind}: takes no option `{name}` (it takes {})", allowed.join(", ")));
        }
        pattern.set(kind, name, value)?;
    }
    if pattern.to.is_some_and(|to| to <= pattern.from) {
        return Err(format!("{kind}: to must be after from"));
    }
    Ok(pattern)
}

/// The shape of a `kind:MAIN` pattern, and the options it takes.
fn parse_shape(kind: &str, main: &str) -> Result<(Shape, &'static [&'static str]), String> {
    match kind {
        "steady" => Ok((Shape::Steady(parse_rate(main)?), &["from", "to", "key", "cost"])),
        "poisson" => {
            Ok((Shape::Poisson { rate: parse_rate(main)?, seed: 1 }, &["from", "to", "seed", "key", "cost"]))
        }
        "burst" => {
            let invalid = |why: String| format!("invalid burst {main:?}: {why}");
            let (count, at) =
                main.split_once('@').ok_or_else(|| invalid("write it as COUNT@TIME, like 100@59s".into()))?;
            let count: u64 = count
                .trim()
                .parse()
                .map_err(|_| invalid(format!("{count:?} is not a whole number of requests")))?;
            let at = parse_offset(at).map_err(invalid)?;
            Ok((Shape::Burst { count, at, every: None }, &["every", "to", "key", "cost"]))
        }
        other => Err(format!(
            "unknown traffic pattern `{other}:` (expected steady:RATE, poisson:RATE, burst:COUNT@TIME or a CSV file)"
        )),
    }
}

impl Pattern {
    /// Applies option `name=value` of a `kind` pattern (one its shape takes).
    fn set(&mut self, kind: &str, name: &str, value: &str) -> Result<(), String> {
        let time = || parse_offset(value).map_err(|e| format!("{kind}: {name}: {e}"));
        let number =
            || value.parse::<u64>().map_err(|_| format!("{kind}: {name}: {value:?} is not a whole number"));
        match (name, &mut self.shape) {
            ("from", _) => self.from = time()?,
            ("to", _) => self.to = Some(time()?),
            ("every", Shape::Burst { every, .. }) => {
                let interval = time()?;
                // Repeats stop at the end of the run (or `to`); a zero interval never would.
                if interval == 0 {
                    return Err(format!("{kind}: every must be above zero"));
                }
                *every = Some(interval);
            }
            ("seed", Shape::Poisson { seed, .. }) => *seed = number()?,
            ("key", _) if value.is_empty() => return Err(format!("{kind}: key cannot be empty")),
            ("key", _) => self.key = value.to_owned(),
            ("cost", _) => {
                self.cost = number()?;
                if self.cost == 0 {
                    return Err(format!("{kind}: cost must be at least 1 (a cost of 0 only peeks)"));
                }
            }
            _ => unreachable!("options are checked against the shape's list first"),
        }
        Ok(())
    }
}

impl FromStr for Traffic {
    type Err = String;

    fn from_str(text: &str) -> Result<Traffic, String> {
        if text.trim().is_empty() {
            return Err("no traffic given (write it like steady:50/s or burst:100@59s)".into());
        }
        let patterns = text.split('+').map(parse_pattern).collect::<Result<Vec<_>, _>>()?;
        Ok(Traffic { patterns, text: text.trim().to_owned() })
    }
}

/// xorshift64*: a tiny, deterministic generator, so Poisson traffic is the same on every run
/// (and in tests) without a `rand` dependency.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        // Spread small seeds over the state; zero would stay zero forever.
        XorShift((seed ^ 0x9E37_79B9_7F4A_7C15).wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1)
    }

    /// Uniform in (0, 1].
    fn next_unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
        (bits as f64 + 1.0) / (1u64 << 53) as f64
    }
}

impl Traffic {
    /// The requests of every pattern within `[0, duration)`, sorted by time.
    pub fn requests(&self, duration: u64) -> anyhow::Result<Requests> {
        let mut out = Requests::default();
        for pattern in &self.patterns {
            match &pattern.shape {
                // A file names its own keys and costs.
                Shape::File(path) => read_csv(path, &mut out, duration)?,
                _ => pattern.generate(&mut out, duration)?,
            }
        }
        // Stable: at equal times, patterns keep the order they were written in.
        out.list.sort_by_key(|r| r.at);
        Ok(out)
    }
}

impl Pattern {
    /// Adds the requests of this (generated, not file) pattern within `[0, duration)` to `out`.
    fn generate(&self, out: &mut Requests, duration: u64) -> anyhow::Result<()> {
        let end = self.to.unwrap_or(duration).min(duration);
        let key = out.key(&self.key);
        match &self.shape {
            Shape::Steady(rate) => {
                // The i-th request at from + i * per / count: exact, no drift over long runs.
                for i in 0u64.. {
                    let offset = u128::from(i) * u128::from(rate.per) / u128::from(rate.count);
                    let at = u64::try_from(u128::from(self.from) + offset).unwrap_or(u64::MAX);
                    if at >= end {
                        break;
                    }
                    out.push(at, key, self.cost)?;
                }
            }
            Shape::Poisson { rate, seed } => {
                let mean = rate.per as f64 / rate.count as f64;
                let mut rng = XorShift::new(*seed);
                let mut at = self.from as f64;
                loop {
                    at += -rng.next_unit().ln() * mean;
                    if at >= end as f64 {
                        break;
                    }
                    out.push(at as u64, key, self.cost)?;
                }
            }
            Shape::Burst { count, at, every } => {
                let mut t = *at;
                while t < end {
                    for _ in 0..*count {
                        out.push(t, key, self.cost)?;
                    }
                    match every {
                        Some(every) => t += every,
                        None => break,
                    }
                }
            }
            Shape::File(_) => unreachable!("files are read, not generated"),
        }
        Ok(())
    }
}

/// Reads `offset[,key[,cost]]` lines; blank lines, `#` comments and a header line are skipped.
fn read_csv(path: &PathBuf, out: &mut Requests, duration: u64) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read traffic file {}", path.display()))?;
    let mut first = true;
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at_line = |message: String| anyhow::anyhow!("{}:{}: {message}", path.display(), number + 1);
        let mut fields = line.split(',').map(str::trim);
        let offset = fields.next().unwrap_or_default();
        let header = std::mem::replace(&mut first, false) && !offset.bytes().any(|b| b.is_ascii_digit());
        let at = match parse_offset(offset) {
            Ok(at) => at,
            // A first line without a digit in its first field is a header (`offset,key,cost`).
            Err(_) if header => continue,
            Err(e) => return Err(at_line(e)),
        };
        let key = match fields.next() {
            Some(key) if !key.is_empty() => key,
            _ => DEFAULT_KEY,
        };
        let cost = match fields.next() {
            Some(cost) if !cost.is_empty() => match cost.parse::<u64>() {
                Ok(cost) if cost > 0 => cost,
                _ => return Err(at_line(format!("cost {cost:?} is not a whole number of at least 1"))),
            },
            _ => 1,
        };
        if let Some(extra) = fields.next() {
            return Err(at_line(format!("unexpected field {extra:?} (lines are offset[,key[,cost]])")));
        }
        if at >= duration {
            out.dropped += 1;
            continue;
        }
        let key = out.key(key);
        out.push(at, key, cost)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn parse(text: &str) -> Traffic {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn times(text: &str, duration: u64) -> Vec<u64> {
        parse(text).requests(duration).unwrap().list.iter().map(|r| r.at).collect()
    }

    #[test]
    fn rates_read_a_unit_alone_as_one_of_it() {
        assert_eq!(parse_rate("50/s"), Ok(Rate { count: 50, per: S }));
        assert_eq!(parse_rate("100/1m"), Ok(Rate { count: 100, per: 60 * S }));
        assert_eq!(parse_rate("5/100ms"), Ok(Rate { count: 5, per: 100_000 }));
        assert_eq!(parse_rate("3/h"), Ok(Rate { count: 3, per: 3_600 * S }));
        assert_eq!(parse_rate("5/2"), Ok(Rate { count: 5, per: 2 * S }), "a bare number is seconds");
        assert!(parse_rate("50").unwrap_err().contains("COUNT/PERIOD"));
        assert!(parse_rate("0/s").unwrap_err().contains("at least 1"));
        assert!(parse_rate("x/s").unwrap_err().contains("not a whole number"));
        assert!(
            parse_rate("5/soon").unwrap_err().starts_with("invalid rate \"5/soon\": invalid time \"soon\"")
        );
    }

    #[test]
    fn offsets_are_seconds_or_durations() {
        assert_eq!(parse_offset("12.5"), Ok(12_500_000));
        assert_eq!(parse_offset("0"), Ok(0));
        assert_eq!(parse_offset("250ms"), Ok(250_000));
        assert_eq!(parse_offset("1m30s"), Ok(90 * S));
        assert!(parse_offset("soon").unwrap_err().contains("invalid time \"soon\""));
        assert!(parse_offset("").is_err());
    }

    #[test]
    fn steady_is_evenly_spaced_and_exact() {
        assert_eq!(times("steady:4/s", S), [0, 250_000, 500_000, 750_000]);
        // 3 a second: a third of a second apart, rounded down, without drift.
        let t = times("steady:3/s", 10 * S);
        assert_eq!(t.len(), 30);
        assert_eq!(&t[..4], [0, 333_333, 666_666, S]);
        assert_eq!(t[29], 9 * S + 666_666);
        assert_eq!(times("steady:2/s,from=1s,to=2s", 10 * S), [S, S + 500_000]);
        assert_eq!(times("steady:50/s", 10 * S).len(), 500);
    }

    #[test]
    fn bursts_come_at_once_and_repeat_within_the_run() {
        assert_eq!(times("burst:3@59s", 60 * S), [59 * S; 3]);
        assert_eq!(times("burst:3@1m", 60 * S), [0u64; 0], "at the end of the run: left out");
        assert_eq!(times("burst:1@10s,every=20s", 60 * S), [10 * S, 30 * S, 50 * S]);
        assert_eq!(times("burst:1@10s,every=20s,to=40s", 60 * S), [10 * S, 30 * S]);
    }

    #[test]
    fn patterns_merge_in_time_order() {
        let traffic = parse("steady:1/s,key=a + burst:2@1500ms,key=b,cost=3");
        let requests = traffic.requests(3 * S).unwrap();
        assert_eq!(requests.keys, ["a", "b"]);
        let got: Vec<(u64, usize, u64)> = requests.list.iter().map(|r| (r.at, r.key, r.cost)).collect();
        assert_eq!(got, [(0, 0, 1), (S, 0, 1), (1_500_000, 1, 3), (1_500_000, 1, 3), (2 * S, 0, 1)]);
    }

    #[test]
    fn poisson_averages_its_rate_and_is_the_same_every_run() {
        let a = times("poisson:50/s", 100 * S);
        assert_eq!(a, times("poisson:50/s", 100 * S));
        assert!((4_700..5_300).contains(&a.len()), "{} requests for 5000 expected", a.len());
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        assert_ne!(a, times("poisson:50/s,seed=2", 100 * S));
    }

    #[test]
    fn mistakes_are_named() {
        let err = |text: &str| text.parse::<Traffic>().unwrap_err();
        assert!(err("stedy:50/s").contains("unknown traffic pattern `stedy:`"));
        assert!(err("burst:100").contains("COUNT@TIME"));
        assert!(err("steady:50/s,every=1s").contains("takes no option `every`"));
        assert!(err("steady:50/s,seed=1").contains("takes no option `seed`"));
        assert!(err("burst:1@0s,cost=0").contains("at least 1"));
        assert!(err("steady:5/s,from=2s,to=1s").contains("to must be after from"));
        assert!(err("steady:5/s,from").contains("NAME=VALUE"));
        assert!(err("").contains("no traffic"));
        assert!(err("csv:").contains("needs a file name"));
    }

    #[test]
    fn csv_files_give_offsets_keys_and_costs() {
        let dir = std::env::temp_dir().join(format!("tollgate-simulate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("traffic.csv");
        std::fs::write(&path, "offset,key,cost\n# a comment\n0.5,alice\n\n250ms,bob,2\n2\n9\n").unwrap();
        let traffic = parse(path.to_str().unwrap());
        let requests = traffic.requests(5 * S).unwrap();
        let got: Vec<(u64, &str, u64)> =
            requests.list.iter().map(|r| (r.at, requests.keys[r.key].as_str(), r.cost)).collect();
        assert_eq!(got, [(250_000, "bob", 2), (500_000, "alice", 1), (2 * S, DEFAULT_KEY, 1)]);
        assert_eq!(requests.dropped, 1, "9 s is after the 5 s run");

        std::fs::write(&path, "1\nlater\n").unwrap();
        let e = traffic.requests(5 * S).unwrap_err().to_string();
        assert!(e.contains("traffic.csv:2: invalid time \"later\""), "{e}");
        std::fs::write(&path, "1,k,0\n").unwrap();
        let e = traffic.requests(5 * S).unwrap_err().to_string();
        assert!(e.contains("traffic.csv:1: cost \"0\""), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
        let e = traffic.requests(5 * S).unwrap_err().to_string();
        assert!(e.starts_with("cannot read traffic file"), "{e}");
    }
}
