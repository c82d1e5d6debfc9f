//! `--rules`: rules written compactly on the command line, or as the configuration file writes
//! them, turned into `tollgate_core::Rule`s by the engine's own deserializer (so the simulator
//! accepts exactly what a policy accepts, with the same messages).
//!
//! ```text
//! fixed_window 100/1m                     limit/period (align=first_hit for first-hit windows)
//! sliding_window_log 100/1m
//! sliding_window_counter 100/1m
//! token_bucket 100/1m                     refill/per; capacity = refill unless capacity=N
//! gcra 100/1m burst=10
//! gcra limit=100 period=1m burst=10       every parameter by name, as in the configuration
//! { algorithm = "gcra", limit = 100, period = "1m", burst = 10 }   a configuration rule as is
//! ```
//!
//! Words are separated by spaces or colons (`fixed_window:100/1m` needs no quoting), and
//! `name=TEXT` names the panel.

use anyhow::{Context, bail};
use serde_json::{Map, Value};
use tollgate_core::{Align, Period, Rule, RuleKind, RuleSet};

/// Parameters whose values are counts (the rest are durations or words).
const COUNTS: [&str; 4] = ["limit", "capacity", "refill", "burst"];

/// Splits `--rules` values at commas outside `{ }` tables and quotes, and parses each rule.
pub fn parse_all(values: &[String]) -> anyhow::Result<Vec<Rule>> {
    let mut rules = Vec::new();
    for value in values {
        for text in split_top_level(value) {
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            let rule =
                parse(text).map_err(anyhow::Error::msg).with_context(|| format!("--rules {text:?}"))?;
            rules.push(rule);
        }
    }
    if rules.is_empty() {
        bail!("--rules: no rule given (write one like \"fixed_window 100/1m\")");
    }
    Ok(rules)
}

fn split_top_level(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut quoted, mut start) = (Vec::new(), 0i32, false, 0);
    for (at, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                parts.push(&text[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// One rule, in either form; validated as a rule set would validate it.
pub fn parse(text: &str) -> Result<Rule, String> {
    let text = text.trim();
    let rule = if text.starts_with('{') {
        #[derive(serde::Deserialize)]
        struct Wrapper {
            rule: Rule,
        }
        toml::from_str::<Wrapper>(&format!("rule = {text}")).map_err(|e| e.message().to_owned())?.rule
    } else {
        compact(text)?
    };
    if let RuleKind::Concurrency { .. } = rule.kind {
        return Err("concurrency rules count leases held at once, and simulate replays checks only; \
                    choose a rate rule"
            .into());
    }
    // The engine's own bounds (log limit, exact GCRA arithmetic, ...), with its messages; "rule 0:"
    // would only confuse here.
    RuleSet::new([rule.clone()]).map_err(|e| e.to_string().trim_start_matches("rule 0: ").to_owned())?;
    Ok(rule)
}

/// `ALGORITHM [COUNT/PERIOD] [NAME=VALUE]...` into the JSON a rule deserializes from.
fn compact(text: &str) -> Result<Rule, String> {
    let mut words = text.split(|c: char| c.is_whitespace() || c == ':').filter(|w| !w.is_empty());
    let algorithm = words.next().unwrap_or_default();
    let mut fields = Map::new();
    fields.insert("algorithm".into(), algorithm.into());
    let mut shorthand = None;
    for word in words {
        if let Some((name, value)) = word.split_once('=') {
            let value = if COUNTS.contains(&name) {
                Value::from(
                    value.parse::<u64>().map_err(|_| format!("{name}: {value:?} is not a whole number"))?,
                )
            } else {
                Value::from(value)
            };
            if fields.insert(name.into(), value).is_some() {
                return Err(format!("{name} is given twice"));
            }
        } else if let Some((count, per)) = word.split_once('/') {
            if shorthand.replace((count, per)).is_some() {
                return Err(format!("{word:?}: only one COUNT/PERIOD per rule"));
            }
        } else {
            return Err(format!(
                "unexpected {word:?}: write a rule like \"fixed_window 100/1m\" or \"gcra 100/1m burst=10\""
            ));
        }
    }
    if let Some((count, per)) = shorthand {
        let count: u64 = count.parse().map_err(|_| format!("{count:?} is not a whole number"))?;
        // `100/m` reads like a rate: a unit alone means one of it (anything else is left for
        // the period's own parser to name).
        let one = format!("1{per}");
        let unit_alone = per.bytes().all(|b| b.is_ascii_alphabetic()) && one.parse::<Period>().is_ok();
        let per = if unit_alone { one } else { per.to_owned() };
        let (count_field, period_field) =
            if algorithm == "token_bucket" { ("refill", "per") } else { ("limit", "period") };
        for (field, value) in [(count_field, Value::from(count)), (period_field, Value::from(per))] {
            if fields.insert(field.into(), value).is_some() {
                return Err(format!("{field} is given twice (by COUNT/PERIOD and by name)"));
            }
        }
        if algorithm == "token_bucket" {
            fields.entry("capacity").or_insert(Value::from(count));
        }
    }
    serde_json::from_value(Value::Object(fields)).map_err(|e| e.to_string())
}

/// A period without spaces (`1m30s`), so that labels parse back as rules.
fn compact_period(period: Period) -> String {
    period.to_string().replace(' ', "")
}

/// The rule's name, or the compact form that parses back to it.
pub fn label(rule: &Rule) -> String {
    if let Some(name) = &rule.name {
        return name.clone();
    }
    let algorithm = rule.algorithm();
    match &rule.kind {
        RuleKind::FixedWindow { limit, period, align: Align::FirstHit } => {
            format!("{algorithm} {limit}/{} align=first_hit", compact_period(*period))
        }
        RuleKind::FixedWindow { limit, period, .. }
        | RuleKind::SlidingWindowLog { limit, period }
        | RuleKind::SlidingWindowCounter { limit, period } => {
            format!("{algorithm} {limit}/{}", compact_period(*period))
        }
        RuleKind::TokenBucket { capacity, refill, per } if capacity == refill => {
            format!("{algorithm} {refill}/{}", compact_period(*per))
        }
        RuleKind::TokenBucket { capacity, refill, per } => {
            format!("{algorithm} {refill}/{} capacity={capacity}", compact_period(*per))
        }
        RuleKind::Gcra { limit, period, burst } => {
            format!("{algorithm} {limit}/{} burst={burst}", compact_period(*period))
        }
        RuleKind::Concurrency { limit, lease } => {
            format!("{algorithm} {limit} lease={}", compact_period(*lease))
        }
    }
}

/// The rule's sustained rate, `count` per `period`: what it admits in the long run under
/// overload, and the span its limit is stated over.
pub fn rate(rule: &Rule) -> (u64, Period) {
    match rule.kind {
        RuleKind::FixedWindow { limit, period, .. }
        | RuleKind::SlidingWindowLog { limit, period }
        | RuleKind::SlidingWindowCounter { limit, period }
        | RuleKind::Gcra { limit, period, .. } => (limit, period),
        RuleKind::TokenBucket { refill, per, .. } => (refill, per),
        RuleKind::Concurrency { limit, lease } => (limit, lease),
    }
}

/// The period of the rule's clock-aligned windows, if it has any (for the chart's window edges).
pub fn clock_windows(rule: &Rule) -> Option<Period> {
    match rule.kind {
        RuleKind::FixedWindow { period, align: Align::Clock, .. }
        | RuleKind::SlidingWindowCounter { period, .. } => Some(period),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Period {
        text.parse().unwrap()
    }

    #[test]
    fn compact_rules_become_engine_rules() {
        let cases = [
            ("fixed_window 100/1m", Rule::fixed_window(100, Period::MINUTE)),
            ("fixed_window:100/m", Rule::fixed_window(100, Period::MINUTE)),
            ("fixed_window 3/1s align=first_hit", Rule::fixed_window_from_first_hit(3, Period::SECOND)),
            ("sliding_window_log 10/1s", Rule::sliding_window_log(10, Period::SECOND)),
            ("sliding_window_counter 100/1h", Rule::sliding_window_counter(100, Period::HOUR)),
            ("token_bucket 100/1m", Rule::token_bucket(100, 100, Period::MINUTE)),
            ("token_bucket 10/1s capacity=50", Rule::token_bucket(50, 10, Period::SECOND)),
            ("gcra 100/1m burst=10", Rule::gcra(100, Period::MINUTE, 10)),
            ("gcra limit=5 period=250ms burst=1 name=pace", Rule::gcra(5, p("250ms"), 1).named("pace")),
        ];
        for (text, rule) in cases {
            assert_eq!(parse(text), Ok(rule), "{text}");
        }
    }

    #[test]
    fn configuration_tables_are_read_as_the_configuration_reads_them() {
        let rule = parse(r#"{ name = "login", algorithm = "gcra", limit = 5, period = "1m", burst = 3 }"#);
        assert_eq!(rule, Ok(Rule::gcra(5, Period::MINUTE, 3).named("login")));
        let err = parse(r#"{ algorithm = "gcra", limit = 5, period = "1m" }"#).unwrap_err();
        assert!(err.contains("missing field `burst`"), "{err}");
    }

    #[test]
    fn labels_parse_back_to_their_rule() {
        for text in [
            "fixed_window 100/1m",
            "fixed_window 3/1s align=first_hit",
            "sliding_window_log 10/1s",
            "sliding_window_counter 7/1m30s",
            "token_bucket 100/1m",
            "token_bucket 10/1s capacity=50",
            "gcra 100/1m burst=10",
        ] {
            let rule = parse(text).unwrap();
            assert_eq!(label(&rule), text);
            assert_eq!(parse(&label(&rule)), Ok(rule));
        }
        assert_eq!(label(&parse("gcra 1/s burst=1 name=pace").unwrap()), "pace");
    }

    #[test]
    fn several_rules_split_at_commas_outside_tables() {
        let rules = parse_all(&[
            "fixed_window 10/1s, gcra 10/1s burst=2".into(),
            r#"{ algorithm = "sliding_window_log", limit = 10, period = "1s" }"#.into(),
        ])
        .unwrap();
        assert_eq!(
            rules,
            [
                Rule::fixed_window(10, Period::SECOND),
                Rule::gcra(10, Period::SECOND, 2),
                Rule::sliding_window_log(10, Period::SECOND)
            ]
        );
        assert!(parse_all(&[" , ".into()]).unwrap_err().to_string().contains("no rule given"));
    }

    #[test]
    fn mistakes_are_named_with_the_engines_words() {
        let err = |text: &str| parse(text).unwrap_err();
        assert!(err("gcra 100/1m").contains("missing field `burst` (gcra takes limit, period, burst)"));
        assert!(err("fixed_window 100/1m burst=3").contains("unknown field `burst`: fixed_window takes"));
        assert!(err("leaky 100/1m").contains("unknown variant `leaky`"));
        assert!(err("fixed_window 100/soon").starts_with("invalid duration \"soon\""));
        assert!(err("fixed_window x/1m").contains("\"x\" is not a whole number"));
        assert!(err("fixed_window 100/1m 5/1s").contains("only one COUNT/PERIOD"));
        assert!(err("fixed_window 100/1m limit=5").contains("limit is given twice"));
        assert!(err("fixed_window 100/1m oops").contains("unexpected \"oops\""));
        assert!(err("fixed_window 0/1m").contains("limit = 0 is out of range"));
        assert!(err("sliding_window_log 50000/1m").contains("use sliding_window_counter"));
        assert!(err("concurrency limit=2 lease=30s").contains("replays checks only"));
    }
}
