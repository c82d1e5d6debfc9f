//! The server's configuration file (`tollgate serve --config`, `tollgate check-config`): TOML
//! text to a validated [`Config`], policies and their rules included. Never panics; a valid
//! configuration's policies survive the round trip through their [`PolicySpec`] (what the
//! management API lists and the database stores, as JSON); an error's line is in the text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_config::{Config, PolicySpec};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match Config::from_toml(text, "fuzz") {
        Ok(config) => {
            for (name, policy) in config.policies.iter() {
                let spec = PolicySpec::of(policy);
                let rebuilt = spec.build(name).unwrap_or_else(|e| panic!("policy {name:?}: {spec:?}: {e}"));
                assert!(policy.rules.rules().eq(rebuilt.rules.rules()), "policy {name:?}: rules changed");
                assert_eq!(policy.mode, rebuilt.mode, "policy {name:?}");
                assert_eq!(policy.on_limit, rebuilt.on_limit, "policy {name:?}: {spec:?}");
                let json = serde_json::to_string(&spec).expect("a spec serializes");
                let back: PolicySpec = serde_json::from_str(&json)
                    .unwrap_or_else(|e| panic!("{json}: does not parse back: {e}"));
                assert_eq!(back, spec, "{json}");
            }
        }
        Err(e) => {
            let _ = e.to_string();
            if let Some(line) = e.line() {
                assert!(line >= 1 && line <= text.lines().count().max(1) + 1, "line {line} of {e}");
            }
        }
    }
});
