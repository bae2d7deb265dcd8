//! The command lines the documentation shows, checked against the program's own flags: a reader
//! who copies `ferry quarantine requeue --where-topic orders` or `loadgen burn-down --preload N`
//! must not meet a flag or subcommand the program does not have.
//!
//! A command line is an inline code span or a line of a fenced block (a line ending in `\` is
//! joined with the next) in which the program's name stands as a word: `ferry …`,
//! `./target/release/ferry …`, or `cargo run … -p loadgen -- …`. From there the words are read
//! as the shell would pass them: a word naming a subcommand of the command reached so far
//! descends into it, and every `--flag` (or `--flag=value`) must be one the command reached
//! takes, its own or a global one of a parent. Hidden flags do not count: they are kept for old
//! spellings, which the documentation must not teach. The line ends at a shell operator (`|`,
//! `;`, `&&`, `>`, …) or a comment. Placeholders (`--where-*`, `…`) are passed over.
use std::path::{Path, PathBuf};

/// A flag (or an unknown word after `help`) of a documented command line that its command does
/// not take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocFlag {
    /// The file, as given.
    pub file: PathBuf,
    /// The line the command line starts on (1-based).
    pub line: usize,
    /// The command reached, e.g. `ferry quarantine requeue`.
    pub command: String,
    /// The flag, without its value.
    pub flag: String,
}

impl std::fmt::Display for DocFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: `{}` takes no {}",
            self.file.display(),
            self.line,
            self.command,
            self.flag
        )
    }
}

/// What [`check`] found: the command lines it read and the flags that are not the program's.
#[derive(Debug, Default)]
pub struct DocCheck {
    /// Command lines of the program read.
    pub command_lines: usize,
    /// Of their flags, those the program does not take.
    pub unknown: Vec<DocFlag>,
}

/// The repository's reference documents: `README.md` and `docs/*.md`. Not `docs/notes/`: a
/// dated note records what was run then, with the flags of that day.
pub fn reference_docs(repo: &Path) -> Vec<PathBuf> {
    let repo = repo.canonicalize().unwrap_or_else(|_| repo.to_path_buf());
    let mut files = vec![repo.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo.join("docs"))
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "md"))
                .collect()
        })
        .unwrap_or_default();
    docs.sort();
    files.extend(docs);
    files
}

/// Checks every command line of `program` in `files` against `cmd` (the program's clap command,
/// as its `CommandFactory` makes it). A file that cannot be read panics: this is a test helper.
pub fn check(cmd: clap::Command, program: &str, files: &[PathBuf]) -> DocCheck {
    let mut cmd = cmd;
    // propagates global flags to the subcommands, adds help and version
    cmd.build();
    let mut out = DocCheck::default();
    for file in files {
        let text = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        for (line, snippet) in snippets(&text) {
            let Some(args) = invocation(&snippet, program) else {
                continue;
            };
            out.command_lines += 1;
            for (command, flag) in unknown_flags(&cmd, program, &args) {
                out.unknown.push(DocFlag {
                    file: file.clone(),
                    line,
                    command,
                    flag,
                });
            }
        }
    }
    out
}

/// Fewer command lines of a program than this in the documents means the parse is broken.
const MIN_COMMAND_LINES: usize = 20;

/// Asserts that the reference documents of the repository that holds `crate_dir` show at least
/// [`MIN_COMMAND_LINES`] command lines of `program` and that none passes a flag or subcommand
/// `cmd` does not have. Called by [`assert_documented_command_lines!`](crate::assert_documented_command_lines)
/// with the calling crate's directory.
#[track_caller]
pub fn assert_command_lines(cmd: clap::Command, program: &str, crate_dir: &str) {
    let repo = Path::new(crate_dir)
        .ancestors()
        .find(|d| d.join("docs").is_dir() && d.join("Cargo.lock").is_file())
        .unwrap_or_else(|| panic!("no repository with docs/ above {crate_dir}"));
    let found = check(cmd, program, &reference_docs(repo));
    assert!(
        found.command_lines >= MIN_COMMAND_LINES,
        "{} command lines of {program}, expected at least {MIN_COMMAND_LINES}",
        found.command_lines
    );
    let unknown: Vec<String> = found.unknown.iter().map(ToString::to_string).collect();
    assert!(unknown.is_empty(), "{}", unknown.join("\n"));
}

/// The inline code spans of the text outside fenced blocks, and the lines of its fenced blocks
/// (continuations joined), each with the line it starts on.
fn snippets(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        if raw.trim_start().starts_with("```") {
            fenced = !fenced;
            out.extend(pending.take());
            continue;
        }
        if fenced {
            let (start, mut joined) = pending.take().unwrap_or((n, String::new()));
            let line = raw.trim_end();
            match line.strip_suffix('\\') {
                Some(head) => {
                    joined.push_str(head);
                    joined.push(' ');
                    pending = Some((start, joined));
                }
                None => {
                    joined.push_str(line);
                    out.push((start, joined));
                }
            }
            continue;
        }
        // `…` spans; a span never crosses a line in these documents
        let mut parts = raw.split('`');
        parts.next();
        while let (Some(code), Some(_)) = (parts.next(), parts.next()) {
            out.push((n, code.to_string()));
        }
    }
    out.extend(pending);
    out
}

/// The words after the program's name in `snippet`, if the program is invoked there: as a word
/// of its own (`ferry`, `…/ferry`), or through `cargo run … -p <program> -- …`.
fn invocation(snippet: &str, program: &str) -> Option<Vec<String>> {
    let words: Vec<&str> = snippet.split_whitespace().collect();
    let named = |w: &str| {
        let w = w.trim_matches(|c| c == '"' || c == '\'');
        w == program || w.ends_with(&format!("/{program}"))
    };
    let start = match words.iter().position(|w| named(w)) {
        Some(i) if i > 0 && matches!(words[i - 1], "-p" | "--package" | "--bin") => {
            // cargo: the program's own words follow `--`, if any
            let dashes = words[i..].iter().position(|w| *w == "--")?;
            i + dashes + 1
        }
        Some(i) => i + 1,
        None => return None,
    };
    let mut args = Vec::new();
    for w in &words[start..] {
        if matches!(*w, "|" | ";" | "&&" | "||" | "&" | "#")
            || w.starts_with('>')
            || w.starts_with("2>")
        {
            break;
        }
        args.push(w.trim_matches(|c| "\"'[](),".contains(c)).to_string());
    }
    Some(args)
}

/// The flags of `args` that the command they reach does not take, with that command's name.
fn unknown_flags(root: &clap::Command, program: &str, args: &[String]) -> Vec<(String, String)> {
    let mut path = vec![program.to_string()];
    let mut cmd = root;
    let mut out = Vec::new();
    for a in args {
        if let Some(flag) = a.strip_prefix("--") {
            let name = flag.split('=').next().unwrap_or_default();
            let placeholder = name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if placeholder || takes(cmd, name) {
                continue;
            }
            out.push((path.join(" "), format!("--{name}")));
        } else if let Some(sub) = cmd.find_subcommand(a) {
            path.push(sub.get_name().to_string());
            cmd = sub;
        }
    }
    out
}

/// Whether `cmd` takes `--name` (not hidden).
fn takes(cmd: &clap::Command, name: &str) -> bool {
    cmd.get_arguments().any(|a| {
        !a.is_hide_set()
            && (a.get_long() == Some(name)
                || a.get_all_aliases()
                    .is_some_and(|aliases| aliases.contains(&name)))
    })
}

/// Names the documents may use that no file of the repository spells: PostgreSQL names a
/// table's primary key index `<table>_pkey` itself.
const NAMED_BY_THE_SERVER: [&str; 1] = ["ferry_outbox_pkey"];

/// The `ferry_…` names (tables, views, functions, indexes, metrics) and `FERRY_…` environment
/// variables that the reference documents and the alert rules (`docs/alerts/`) use but no
/// source file, migration, example, script or CI step of the repository spells: a renamed
/// metric or table that the documents still teach. A name written as a prefix
/// (`ferry_retention_*`) needs a name that starts with it.
pub fn unknown_names(repo: &Path) -> Vec<String> {
    let mut docs = reference_docs(repo);
    docs.extend(files_under(&repo.join("docs/alerts"), &["yml"]));
    let mut code = std::collections::BTreeSet::new();
    for dir in [
        "crates",
        "loadgen",
        "benches",
        "migrations",
        "docs/examples",
        ".ci",
    ] {
        for file in files_under(&repo.join(dir), &["rs", "sql", "py", "sh", "toml", ""]) {
            if let Ok(text) = std::fs::read_to_string(&file) {
                code.extend(names(&text).into_iter().map(|(n, _)| n));
            }
        }
    }
    let mut unknown = std::collections::BTreeSet::new();
    for file in &docs {
        let text = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        for (name, prefix) in names(&text) {
            let known = if prefix {
                // the code may spell the prefix itself (`format!("ferry_t_{}", …)`)
                code.iter().any(|c| c.starts_with(&name))
            } else {
                code.contains(&name) || NAMED_BY_THE_SERVER.contains(&name.as_str())
            };
            if !known {
                let star = if prefix { "*" } else { "" };
                unknown.insert(format!("{}: {name}{star}", file.display()));
            }
        }
    }
    unknown.into_iter().collect()
}

/// The files below `dir` (recursively, `target` and hidden folders left out) whose extension is
/// one of `exts` (`""`: no extension).
fn files_under(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if name != "target" && !name.starts_with('.') {
                out.extend(files_under(&p, exts));
            }
        } else {
            let ext = p
                .extension()
                .map_or(String::new(), |x| x.to_string_lossy().into_owned());
            if exts.contains(&ext.as_str()) {
                out.push(p);
            }
        }
    }
    out
}

/// The `ferry_…` and `FERRY_…` names in `text`, each with whether it is written as a prefix
/// (`ferry_x_*`, `FERRY_TEST_…`, or `FERRY_TEST_` alone).
fn names(text: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    for (start, _) in text.char_indices() {
        let rest = &text[start..];
        let upper = rest.starts_with("FERRY_");
        if !(upper || rest.starts_with("ferry_")) {
            continue;
        }
        let before = start.checked_sub(1).map(|i| bytes[i]);
        if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_') {
            continue;
        }
        let len = rest
            .bytes()
            .take_while(|b| {
                b.is_ascii_digit()
                    || *b == b'_'
                    || if upper {
                        b.is_ascii_uppercase()
                    } else {
                        b.is_ascii_lowercase()
                    }
            })
            .count();
        let name = &rest[..len];
        let after = &rest[len..];
        let prefix = name.ends_with('_') || after.starts_with('*') || after.starts_with('…');
        out.push((name.to_string(), prefix));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};

    fn program() -> Command {
        Command::new("tool")
            .arg(Arg::new("url").long("url").global(true))
            .arg(
                Arg::new("old")
                    .long("old")
                    .hide(true)
                    .action(ArgAction::SetTrue),
            )
            .subcommand(
                Command::new("queue")
                    .subcommand(Command::new("requeue").arg(Arg::new("w").long("where-topic")))
                    .arg(Arg::new("limit").long("limit")),
            )
            .subcommand(Command::new("run").arg(Arg::new("n").long("preload")))
    }

    fn unknown(text: &str) -> Vec<String> {
        let dir = crate::TempDir::new("ferry-docs-check").unwrap();
        let file = dir.path().join("doc.md");
        std::fs::write(&file, text).unwrap();
        let c = check(program(), "tool", std::slice::from_ref(&file));
        c.unknown
            .iter()
            .map(|u| format!("{}:{} {}", u.line, u.command, u.flag))
            .collect()
    }

    #[test]
    fn flags_are_checked_against_the_command_they_reach() {
        let text = "Run `tool queue requeue --where-topic orders --url x` (global), \
                    `tool queue --limit 3`, `tool run --preload 5`.\n\
                    Not a command: `tools --nope`, `tool_table`, `--free-standing`.\n\
                    Wrong: `tool queue --preload 5`, `tool --old`, `tool run --preload=5 --limit 3`.\n\
                    ```sh\n\
                    tool queue requeue \\\n  --where-topic t \\\n  --bogus 1 | grep --count x\n\
                    cargo run --release -p tool -- run --preload 1 --what\n\
                    ./target/debug/tool --url u run --where-* --preload … # --comment\n\
                    ```\n";
        assert_eq!(
            unknown(text),
            [
                "3:tool queue --preload",
                "3:tool --old",
                "3:tool run --limit",
                "5:tool queue requeue --bogus",
                "8:tool run --what",
            ]
        );
    }

    #[test]
    fn names_and_prefixes_are_read() {
        let got =
            names("`ferry_outbox`, ferry_retention_*, FERRY_TEST_…_URL, xferry_no, FERRY_LOG=1");
        assert_eq!(
            got,
            [
                ("ferry_outbox".to_string(), false),
                ("ferry_retention_".to_string(), true),
                ("FERRY_TEST_".to_string(), true),
                ("FERRY_LOG".to_string(), false),
            ]
        );
    }

    /// Every `ferry_…` name and `FERRY_…` variable the documents use is spelled somewhere in
    /// the repository's code, migrations, examples or CI.
    #[test]
    fn documented_names_exist() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let unknown = unknown_names(&repo);
        assert!(unknown.is_empty(), "{}", unknown.join("\n"));
    }

    #[test]
    fn reference_docs_leave_the_notes_out() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let files = reference_docs(&repo);
        assert!(files.iter().any(|f| f.ends_with("docs/operations.md")));
        assert!(files.iter().any(|f| f.ends_with("README.md")));
        assert!(!files
            .iter()
            .any(|f| f.components().any(|c| c.as_os_str() == "notes")));
    }
}
