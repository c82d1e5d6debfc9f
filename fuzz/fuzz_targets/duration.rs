//! Durations as configuration writes them: [`Period`]'s parser (rule periods, `max_wait`,
//! `backend.timeout`, leases in the JSON API) and the humantime parser under it. Never panics;
//! a period that parses displays as text that parses back to the same period, and its serde
//! forms (string, integer of milliseconds) agree.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tollgate_core::Period;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };

    if let Ok(d) = humantime::parse_duration(text) {
        let shown = humantime::format_duration(d).to_string();
        let back = humantime::parse_duration(&shown).unwrap_or_else(|e| panic!("{shown:?}: {e}"));
        assert_eq!(back, d, "{text:?} displays as {shown:?}");
    }

    match text.parse::<Period>() {
        Ok(p) => {
            assert!(Period::MIN <= p && p <= Period::MAX, "{text:?}: {p:?}");
            let shown = p.to_string();
            let back: Period =
                shown.parse().unwrap_or_else(|e| panic!("{text:?} displays as {shown:?}: {e}"));
            assert_eq!(back, p, "{text:?} displays as {shown:?}");
            assert_eq!(Period::try_from(p.as_duration()), Ok(p));
            // Serde: the string form, and (when whole) milliseconds.
            let json = serde_json::to_string(&p).expect("serializes");
            assert_eq!(serde_json::from_str::<Period>(&json).ok(), Some(p), "{json}");
            if p.as_micros() % 1_000 == 0 {
                let millis = p.as_micros() / 1_000;
                assert_eq!(serde_json::from_str::<Period>(&millis.to_string()).ok(), Some(p));
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }

    // Through the deserializers the config file and the JSON API use.
    let _ = serde_json::from_slice::<Period>(data);
    if let Ok(value) = toml::from_str::<toml::Table>(&format!("p = {text}")) {
        let _ = value.get("p").cloned().map(|v| v.try_into::<Period>());
    }
    // A bare integer of milliseconds.
    if let Ok(n) = text.trim().parse::<u64>() {
        let p = Period::from_millis(n);
        assert_eq!(p.is_ok(), (1..=31_557_600_000).contains(&n), "{n} ms");
        if let Ok(p) = p {
            assert_eq!(p.as_duration(), Duration::from_millis(n));
        }
    }
});
