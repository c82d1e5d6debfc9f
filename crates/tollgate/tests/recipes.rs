//! The docs' recipes, run as written, so that a command the README or docs/recipes.md shows
//! cannot drift from the binary (issue 23).
//!
//! A fenced block of README.md or docs/recipes.md is part of a recipe when an HTML comment
//! just before it names one: `<!-- recipe: NAME [OPTION...] -->`. A recipe's blocks run in
//! document order, in one bash session of their own (`set -e`, in a temporary directory), with
//! the `tollgate` under test first on PATH and `cargo run --release --` standing for it:
//!
//! - In a `sh` block, every line goes to the shell. The `#> ` lines after a command are what it
//!   prints (its standard output, CR dropped, trailing blanks ignored): `...` stands for any
//!   text within a line, and a `#> ...` line alone for any number of lines. A command that no
//!   `#>` line follows must print nothing. A command ending in `&` starts in the background
//!   (its output kept in a file of its own), and the test waits until every port it names, or
//!   listens on by default, accepts connections.
//! - A block whose first line is `# FILE` (a name with a dot, such as `# api.toml`) is written
//!   to FILE when the recipe reaches it.
//!
//! Ports: every `localhost:PORT` and `127.0.0.1:PORT` of a recipe (and the same number standing
//! alone in its commands, as in `http.server 3000`) is moved to a free port, the same one
//! throughout the recipe, and so are the defaults (`serve` on 8080 and 8081, `proxy` on 8000,
//! the management clients' server): recipes run side by side and never meet a server of the
//! machine. Outputs are compared with the doc's ports put back.
//!
//! Options: `redis` starts a private Redis (tollgate-testkit) where the recipe says 6379;
//! `fresh:1m` (any period) waits, before the block, until at least 15 s remain in the current
//! clock-aligned window of that period, for blocks whose counts live in such windows (a
//! consumer's minute); without it the window could turn between two of the block's requests.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};

/// The documents whose marked blocks are recipes.
const DOCS: [&str; 2] = ["README.md", "docs/recipes.md"];

/// Options a recipe's marker may carry (beside `fresh:PERIOD`).
const OPTIONS: [&str; 1] = ["redis"];

/// The longest one step may take: a loop of a hundred requests on a loaded machine.
const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest a background server may take to listen.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(60);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One marked block.
#[derive(Clone, Debug)]
struct Block {
    recipe: String,
    options: Vec<String>,
    lang: String,
    text: String,
    /// `file:line`, for messages.
    origin: String,
}

/// Every marked block of [`DOCS`], in document order.
fn blocks() -> Vec<Block> {
    let mut out = Vec::new();
    for doc in DOCS {
        let text = std::fs::read_to_string(root().join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
        let line_of = |offset: usize| text[..offset].matches('\n').count() + 1;
        let mut marker: Option<(String, Vec<String>)> = None;
        let mut open: Option<Block> = None;
        for (event, range) in Parser::new(&text).into_offset_iter() {
            match event {
                Event::Html(html) | Event::InlineHtml(html) => {
                    if let Some(rest) = html.trim().strip_prefix("<!-- recipe:") {
                        let words: Vec<String> =
                            rest.trim_end_matches("-->").split_whitespace().map(str::to_owned).collect();
                        let (name, options) = words.split_first().unwrap_or_else(|| {
                            panic!("{doc}:{}: a recipe marker names no recipe", line_of(range.start))
                        });
                        for option in options {
                            assert!(
                                OPTIONS.contains(&option.as_str()) || option.starts_with("fresh:"),
                                "{doc}:{}: unknown recipe option {option:?}",
                                line_of(range.start)
                            );
                        }
                        marker = Some((name.clone(), options.to_vec()));
                    }
                }
                Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info))) => {
                    if let Some((recipe, options)) = marker.take() {
                        let lang = info.split([',', ' ']).next().unwrap_or_default().to_owned();
                        let origin = format!("{doc}:{}", line_of(range.start));
                        open = Some(Block { recipe, options, lang, text: String::new(), origin });
                    }
                }
                Event::Text(t) if open.is_some() => open.as_mut().unwrap().text.push_str(&t),
                Event::End(TagEnd::CodeBlock) => out.extend(open.take()),
                // A marker names the block right after it, and no other.
                Event::Start(_) => marker = None,
                _ => {}
            }
        }
        assert!(marker.is_none(), "{doc}: a recipe marker at the end names no block");
    }
    out
}

/// One command (or several lines fed together) and what it must print.
#[derive(Debug)]
struct Step {
    commands: String,
    expected: Vec<String>,
    background: bool,
}

/// The steps of a `sh` block.
fn steps(block: &Block) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut pending = String::new();
    let mut logical = String::new();
    let flush = |pending: &mut String, steps: &mut Vec<Step>| {
        if !pending.trim().is_empty() {
            steps.push(Step { commands: std::mem::take(pending), expected: Vec::new(), background: false });
        }
        pending.clear();
    };
    for line in block.text.lines() {
        if let Some(shown) = line.strip_prefix("#>") {
            assert!(logical.is_empty(), "{}: an output line inside a continued command", block.origin);
            flush(&mut pending, &mut steps);
            let last =
                steps.last_mut().unwrap_or_else(|| panic!("{}: output before any command", block.origin));
            assert!(!last.background, "{}: a background command prints nothing here", block.origin);
            last.expected.push(shown.strip_prefix(' ').unwrap_or(shown).trim_end().to_owned());
            continue;
        }
        logical.push_str(line);
        logical.push('\n');
        if line.ends_with('\\') {
            continue;
        }
        let whole = std::mem::take(&mut logical);
        let trimmed = whole.trim_end();
        if trimmed.ends_with('&') && !trimmed.ends_with("&&") {
            flush(&mut pending, &mut steps);
            steps.push(Step { commands: whole, expected: Vec::new(), background: true });
        } else {
            // After shown output, `pending` is empty: a command there starts a step of its own.
            pending.push_str(&whole);
        }
    }
    assert!(logical.is_empty(), "{}: the block ends inside a continued command", block.origin);
    flush(&mut pending, &mut steps);
    steps
}

/// Whether `line` matches `pattern`, whose `...` stand for any text.
fn line_matches(pattern: &str, line: &str) -> bool {
    let parts: Vec<&str> = pattern.split("...").collect();
    let [first, middle @ .., last] = parts.as_slice() else { return pattern == line };
    let Some(mut rest) = line.strip_prefix(first) else { return false };
    if rest.len() < last.len() || !rest.ends_with(last) {
        return false;
    }
    rest = &rest[..rest.len() - last.len()];
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Whether `actual` matches `expected`, where a line `...` stands for any number of lines.
fn lines_match(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((e, rest)) if e == "..." => (0..=actual.len()).any(|i| lines_match(rest, &actual[i..])),
        Some((e, rest)) => {
            actual.first().is_some_and(|a| line_matches(e, a)) && lines_match(rest, &actual[1..])
        }
    }
}

/// The doc's ports and the free ones they stand for.
struct Ports(BTreeMap<u16, u16>);

/// The `localhost:PORT` and `127.0.0.1:PORT` of `text`: where each port's digits start, and it.
fn addresses(text: &str) -> Vec<(usize, usize, u16)> {
    let mut found = Vec::new();
    for host in ["localhost:", "127.0.0.1:"] {
        for (at, _) in text.match_indices(host) {
            let start = at + host.len();
            let digits = text[start..].bytes().take_while(u8::is_ascii_digit).count();
            if let Ok(port) = text[start..start + digits].parse::<u16>() {
                found.push((start, start + digits, port));
            }
        }
    }
    found.sort_unstable();
    found
}

impl Ports {
    /// The ports of every block of a recipe, each given a free port (6379 the recipe's Redis).
    fn of(blocks: &[&Block], redis: Option<u16>) -> Ports {
        let mut map = BTreeMap::new();
        let doc_ports = [8080, 8081, 8000]
            .into_iter()
            .chain(blocks.iter().flat_map(|b| addresses(&b.text).into_iter().map(|a| a.2)));
        for port in doc_ports {
            map.entry(port).or_insert_with(tollgate_testkit::free_port);
        }
        if let Some(redis) = redis {
            map.insert(6379, redis);
        }
        Ports(map)
    }

    fn get(&self, port: u16) -> u16 {
        self.0[&port]
    }

    /// `text` with its addresses moved, and in commands, the recipe's ports standing alone too.
    fn map(&self, text: &str, commands: bool) -> String {
        let mut out = String::new();
        let mut from = 0;
        for (start, end, port) in addresses(text) {
            out.push_str(&text[from..start]);
            out.push_str(&self.get(port).to_string());
            from = end;
        }
        out.push_str(&text[from..]);
        if !commands {
            return out;
        }
        // A bare number equal to a port of the recipe, as a word of its own.
        let mut words = String::new();
        let mut token = String::new();
        for c in out.chars().chain(std::iter::once('\n')) {
            if c.is_ascii_digit() {
                token.push(c);
                continue;
            }
            if !token.is_empty() {
                let alone = !words.ends_with(|p: char| p.is_alphanumeric() || ":.-_/=".contains(p))
                    && (c.is_whitespace() || c == ';');
                match token.parse::<u16>().ok().and_then(|p| self.0.get(&p)).filter(|_| alone) {
                    Some(mapped) => words.push_str(&mapped.to_string()),
                    None => words.push_str(&token),
                }
                token.clear();
            }
            words.push(c);
        }
        words.pop();
        words
    }

    /// `text` with the doc's ports put back in its addresses.
    fn unmap(&self, text: &str) -> String {
        let back: BTreeMap<u16, u16> = self.0.iter().map(|(doc, free)| (*free, *doc)).collect();
        let mut out = String::new();
        let mut from = 0;
        for (start, end, port) in addresses(text) {
            out.push_str(&text[from..start]);
            out.push_str(&back.get(&port).copied().unwrap_or(port).to_string());
            from = end;
        }
        out.push_str(&text[from..]);
        out
    }
}

/// A recipe's bash session and what it started, all stopped when dropped.
struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: Receiver<Vec<u8>>,
    buffer: Vec<u8>,
    dir: tempfile::TempDir,
    steps: usize,
    backgrounds: usize,
}

impl Session {
    fn start(ports: &Ports) -> Session {
        let dir = tempfile::tempdir().unwrap();
        // Only `tollgate` of the build directory comes first on PATH, as after an install.
        let bin = dir.path().join(".bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tollgate"), bin.join("tollgate")).unwrap();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let stderr = std::fs::File::create(dir.path().join(".shell.err")).unwrap();
        let mut command = Command::new("bash");
        command.args(["--noprofile", "--norc"]).current_dir(dir.path());
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if name.starts_with("TOLLGATE_") || name == "RUST_LOG" || name == "REDIS_URL" {
                command.env_remove(&*name);
            }
        }
        let local = |port: u16| format!("127.0.0.1:{}", ports.get(port));
        let mut child = command
            .env("PATH", path)
            .env("LC_ALL", "C")
            .env("NO_COLOR", "1")
            .env("TOLLGATE_LISTEN", local(8080))
            .env("TOLLGATE_GRPC_LISTEN", local(8081))
            .env("TOLLGATE_PROXY_LISTEN", local(8000))
            .env("TOLLGATE_SERVER", format!("http://{}", local(8080)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            // Its own process group: the servers it starts are stopped with it.
            .process_group(0)
            .spawn()
            .expect("bash starts");
        let stdin = child.stdin.take().unwrap();
        let mut out = child.stdout.take().unwrap();
        let (tx, stdout) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = out.read(&mut chunk) {
                if n == 0 || tx.send(chunk[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        let mut session = Session { child, stdin, stdout, buffer: Vec::new(), dir, steps: 0, backgrounds: 0 };
        session.feed("set -e\n");
        session
    }

    fn feed(&mut self, text: &str) {
        self.stdin
            .write_all(text.as_bytes())
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|e| panic!("the shell stopped taking commands ({e}):\n{}", self.diagnostics()));
    }

    /// What the shell and the background commands wrote to their logs.
    fn diagnostics(&self) -> String {
        let mut out = String::new();
        let mut logs: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "log" || x == "err"))
            .collect();
        logs.sort();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            out.push_str(&format!(
                "--- {}:\n{}\n",
                log.file_name().unwrap().to_string_lossy(),
                tail.join("\n")
            ));
        }
        out
    }

    /// Runs `commands` and answers what they printed.
    fn run(&mut self, commands: &str) -> String {
        self.steps += 1;
        let mark = format!("__recipe_step_{}_done__", self.steps);
        self.feed(&format!("{commands}\nprintf '\\n%s\\n' {mark}\n"));
        let end = format!("\n{mark}\n");
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            if let Some(at) = self.buffer.windows(end.len()).position(|w| w == end.as_bytes()) {
                let output = String::from_utf8_lossy(&self.buffer[..at]).into_owned();
                self.buffer.drain(..at + end.len());
                return output;
            }
            match self.stdout.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(chunk) => self.buffer.extend(chunk),
                Err(RecvTimeoutError::Timeout) => panic!(
                    "no end after {STEP_TIMEOUT:?}; printed so far:\n{}\n{}",
                    String::from_utf8_lossy(&self.buffer),
                    self.diagnostics()
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "the shell exited (a command failed, under set -e); printed:\n{}\n{}",
                    String::from_utf8_lossy(&self.buffer),
                    self.diagnostics()
                ),
            }
        }
    }

    /// Starts `command` (ending in `&`) in the background, its output to a log of its own.
    fn background(&mut self, command: &str) {
        self.backgrounds += 1;
        let body = command.trim_end().trim_end_matches('&');
        let log = format!("background-{}.log", self.backgrounds);
        let output = self.run(&format!("{{ {body}\n}} >>{log} 2>&1 &"));
        assert!(output.is_empty(), "starting {command:?} printed {output:?}");
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).stderr(Stdio::null()).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && Command::new("kill")
                .args(["-0", "--", &group])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
        let _ = self.child.wait();
    }
}

/// The ports a background command will listen on (or needs): those its text names, and the
/// default listener of `tollgate serve` or `tollgate proxy` when it names none.
fn awaited_ports(command: &str, ports: &Ports) -> BTreeSet<u16> {
    let mut awaited: BTreeSet<u16> = addresses(command).into_iter().map(|a| a.2).collect();
    for word in command.split_whitespace() {
        if let Ok(port) = word.parse::<u16>()
            && ports.0.contains_key(&port)
        {
            awaited.insert(port);
        }
    }
    let tollgate = command.contains("tollgate ") || command.contains("cargo run");
    if tollgate && !command.contains("--listen") {
        if command.contains(" serve") {
            awaited.insert(8080);
        } else if command.contains(" proxy") {
            awaited.insert(8000);
        }
    }
    awaited
}

fn wait_for_ports(session: &Session, ports: &Ports, doc_ports: &BTreeSet<u16>, origin: &str) {
    for doc in doc_ports {
        let addr = SocketAddr::from(([127, 0, 0, 1], ports.get(*doc)));
        let deadline = Instant::now() + LISTEN_TIMEOUT;
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "{origin}: nothing listens on port {doc} ({addr}) after {LISTEN_TIMEOUT:?}\n{}",
                session.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

/// Waits, if need be, until at least 15 s remain in the clock-aligned window of `period`.
fn fresh_window(period: &str) {
    let period = humantime::parse_duration(period).unwrap_or_else(|e| panic!("fresh:{period}: {e}"));
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let left = period.as_millis() - now.as_millis() % period.as_millis();
    if left < 15_000 {
        std::thread::sleep(Duration::from_millis(u64::try_from(left).unwrap() + 100));
    }
}

/// Runs every block of the recipe `name`, panicking at the first output that differs.
fn run_recipe(name: &str) {
    let all = blocks();
    let blocks: Vec<&Block> = all.iter().filter(|b| b.recipe == name).collect();
    assert!(!blocks.is_empty(), "no block is marked <!-- recipe: {name} -->");
    let redis = blocks
        .iter()
        .any(|b| b.options.iter().any(|o| o == "redis"))
        .then(tollgate_testkit::RedisServer::start);
    let ports = Ports::of(&blocks, redis.as_ref().map(tollgate_testkit::RedisServer::port));
    let mut session = Session::start(&ports);
    for block in blocks {
        for option in &block.options {
            if let Some(period) = option.strip_prefix("fresh:") {
                fresh_window(period);
            }
        }
        if let Some(file) = block
            .text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# "))
            .filter(|f| f.contains('.') && !f.contains(' '))
        {
            std::fs::write(session.dir.path().join(file), ports.map(&block.text, false)).unwrap();
            continue;
        }
        assert_eq!(block.lang, "sh", "{}: a recipe's block is a `sh` block or a `# FILE`", block.origin);
        for step in steps(block) {
            let commands = ports.map(&step.commands.replace("cargo run --release --", "tollgate"), true);
            if step.background {
                session.background(&commands);
                wait_for_ports(&session, &ports, &awaited_ports(&step.commands, &ports), &block.origin);
                continue;
            }
            let output = ports.unmap(&session.run(&commands)).replace('\r', "");
            let output = output.strip_suffix('\n').unwrap_or(&output);
            let actual: Vec<String> = if output.is_empty() {
                Vec::new()
            } else {
                output.split('\n').map(|l| l.trim_end().to_owned()).collect()
            };
            assert!(
                lines_match(&step.expected, &actual),
                "{}: recipe {name}: the output differs from the doc's\n--- command:\n{}\n--- shown:\n{}\n--- printed:\n{}\n--- as strings:\n{:?}\n{:?}\n{}",
                block.origin,
                step.commands.trim_end(),
                step.expected.join("\n"),
                actual.join("\n"),
                step.expected,
                actual,
                session.diagnostics()
            );
        }
    }
}

/// The recipes this file runs, one test each.
const RECIPES: [&str; 8] =
    ["readme", "simulate", "api-key", "two-instances", "proxy", "plans", "shadow", "envoy"];

#[test]
fn every_recipe_of_the_docs_has_its_test() {
    let found: BTreeSet<String> = blocks().into_iter().map(|b| b.recipe).collect();
    let tested: BTreeSet<String> = RECIPES.iter().map(|r| (*r).to_owned()).collect();
    assert_eq!(found, tested, "a recipe of the docs without a test below, or a test without its recipe");
}

#[test]
fn recipe_readme() {
    run_recipe("readme");
}

#[test]
fn recipe_simulate() {
    run_recipe("simulate");
}

#[test]
fn recipe_api_key() {
    run_recipe("api-key");
}

#[test]
fn recipe_two_instances() {
    run_recipe("two-instances");
}

#[test]
fn recipe_proxy() {
    run_recipe("proxy");
}

#[test]
fn recipe_plans() {
    run_recipe("plans");
}

#[test]
fn recipe_shadow() {
    run_recipe("shadow");
}

/// Its commands; tests/envoy_recipe.rs checks its envoy.yaml and the descriptors it sends.
#[test]
fn recipe_envoy() {
    run_recipe("envoy");
}

/// A Rust block marked `<!-- excerpt: PATH -->` shows lines of PATH, a file the build compiles
/// (an example), in their order: every line of the block is one of the file's, from where the
/// previous one was, and `// ...` marks lines left out.
#[test]
fn the_readme_excerpts_are_their_files_own_lines() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut excerpts = 0;
    let mut rest = readme.as_str();
    while let Some(at) = rest.find("<!-- excerpt: ") {
        let after = &rest[at + "<!-- excerpt: ".len()..];
        let path = after[..after.find(" -->").expect("an excerpt marker ends with -->")].trim();
        let file = std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        let block = &after[after.find("```").expect("a block after the marker")..];
        let body = &block[block.find('\n').unwrap() + 1..];
        let body = &body[..body.find("```").unwrap()];
        let lines: Vec<&str> = file.lines().map(str::trim_end).collect();
        let mut next = 0;
        let mut contiguous = true;
        for shown in body.lines().map(str::trim_end) {
            if shown.trim() == "// ..." {
                contiguous = false;
                continue;
            }
            let found = if contiguous && next > 0 {
                (lines.get(next) == Some(&shown)).then_some(next)
            } else {
                lines[next..].iter().position(|l| *l == shown).map(|i| next + i)
            };
            let Some(line) = found else {
                panic!(
                    "README's excerpt of {path}: {shown:?} is not the file's next line (from line {})",
                    next + 1
                )
            };
            next = line + 1;
            contiguous = true;
        }
        excerpts += 1;
        rest = &after[after.find("```").unwrap()..];
    }
    assert!(excerpts >= 1, "the tower layer's snippet is an excerpt of its example");
}

/// GitHub's anchor of a heading: lower case, spaces as hyphens, other punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in Parser::new(text) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) if heading.is_some() => heading.as_mut().unwrap().push_str(&t),
            Event::End(TagEnd::Heading(_)) => {
                found.insert(anchor(&heading.take().unwrap()));
            }
            _ => {}
        }
    }
    found
}

/// The links of the README and the recipes lead to a file of the repository and, with an
/// anchor, to one of its headings (a renamed section breaks no reader's link silently).
#[test]
fn the_docs_links_lead_somewhere() {
    let mut checked = 0;
    for doc in DOCS {
        let path = root().join(doc);
        let text = std::fs::read_to_string(&path).unwrap();
        for event in Parser::new(&text) {
            let (Event::Start(Tag::Link { dest_url, .. }) | Event::Start(Tag::Image { dest_url, .. })) =
                event
            else {
                continue;
            };
            if dest_url.contains("://") || dest_url.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = dest_url.split_once('#').unwrap_or((&dest_url, ""));
            let target = if file.is_empty() { path.clone() } else { path.parent().unwrap().join(file) };
            assert!(target.exists(), "{doc}: the link {dest_url} leads to no file");
            if !fragment.is_empty() {
                let headings = anchors(&std::fs::read_to_string(&target).unwrap());
                assert!(
                    headings.contains(fragment),
                    "{doc}: {dest_url}: no heading has the anchor #{fragment}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 20, "{checked} links");
    assert_eq!(
        anchor("Seeing the algorithms: `tollgate simulate`"),
        "seeing-the-algorithms-tollgate-simulate"
    );
    assert_eq!(anchor("Why was a request refused?"), "why-was-a-request-refused");
}

#[test]
fn output_patterns_match_as_documented() {
    assert!(line_matches("a...c", "abbbc"));
    assert!(line_matches("{\"x\":...,\"y\":2}", "{\"x\":15,\"y\":2}"));
    assert!(!line_matches("a...c", "abbb"));
    assert!(!line_matches("ab...ba", "aba"), "prefix and suffix may not overlap");
    assert!(line_matches("...", ""));
    let lines = |s: &[&str]| s.iter().map(|l| (*l).to_owned()).collect::<Vec<_>>();
    assert!(lines_match(&lines(&["a", "...", "z"]), &lines(&["a", "b", "c", "z"])));
    assert!(lines_match(&lines(&["a", "...", "z"]), &lines(&["a", "z"])));
    assert!(!lines_match(&lines(&["a", "z"]), &lines(&["a", "b", "z"])));
    assert!(!lines_match(&lines(&[]), &lines(&["printed"])));
}

#[test]
fn ports_are_moved_in_addresses_and_where_they_stand_alone() {
    let ports = Ports(BTreeMap::from([(8080, 40001), (3000, 40002), (8081, 40003), (8000, 40004)]));
    assert_eq!(
        ports.map("curl localhost:8080/x; python3 -m http.server 3000 &\nseq 3000x 13000 a3000", true),
        "curl localhost:40001/x; python3 -m http.server 40002 &\nseq 3000x 13000 a3000"
    );
    assert_eq!(
        ports.map("url = \"redis://127.0.0.1:8080\" # 3000", false),
        "url = \"redis://127.0.0.1:40001\" # 3000"
    );
    assert_eq!(ports.unmap("at http://127.0.0.1:40002/ 40002"), "at http://127.0.0.1:3000/ 40002");
    assert_eq!(awaited_ports("tollgate serve --config a.toml &", &ports), BTreeSet::from([8080]));
    assert_eq!(
        awaited_ports("tollgate proxy --upstream http://127.0.0.1:3000 &", &ports),
        BTreeSet::from([3000, 8000])
    );
}

#[test]
fn a_block_becomes_steps() {
    let block = Block {
        recipe: "r".into(),
        options: Vec::new(),
        lang: "sh".into(),
        text: "tollgate serve &\n# a comment\nA=1\ncurl x \\\n  -d y\n#> out\n#>\necho z\nfor i in 1 2; do\n  echo $i\ndone\n#> 1\n#> 2\n".into(),
        origin: "t".into(),
    };
    let steps = steps(&block);
    let shown: Vec<(&str, Vec<String>, bool)> =
        steps.iter().map(|s| (s.commands.as_str(), s.expected.clone(), s.background)).collect();
    assert_eq!(
        shown,
        [
            ("tollgate serve &\n", vec![], true),
            ("# a comment\nA=1\ncurl x \\\n  -d y\n", vec!["out".to_owned(), String::new()], false),
            ("echo z\nfor i in 1 2; do\n  echo $i\ndone\n", vec!["1".to_owned(), "2".to_owned()], false),
        ]
    );
}
