//! Shard lists: paths, brace ranges (`train-{000000..001023}.tar`, zero-padded, several braces
//! in one pattern, `{a,b}` lists), globs (`*`, `?` in any component) and lists of them.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::storage::glob_match;

/// The most shards one pattern expands to: a typo like `{0..99999999999}` fails fast.
const MAX_EXPANSION: usize = 10_000_000;

fn list_error(pattern: &str, problem: impl Into<String>) -> Error {
    Error::Tar {
        shard: pattern.to_owned(),
        offset: 0,
        problem: problem.into(),
    }
}

/// Expands the braces of `pattern`, left to right: `{a..b}` (numbers, zero-padded to the
/// wider bound when either bound starts with `0`; descending when `a > b`) and `{x,y,z}`.
///
/// # Errors
///
/// [`Error::Tar`] naming the pattern for an unclosed brace, a bad range or an expansion of
/// more than ten million names.
pub(crate) fn expand_braces(pattern: &str) -> Result<Vec<String>> {
    let mut out = vec![String::new()];
    let mut rest = pattern;
    while let Some(open) = rest.find('{') {
        let close = rest[open..]
            .find('}')
            .map(|c| open + c)
            .ok_or_else(|| list_error(pattern, "a `{` without its `}`"))?;
        let body = &rest[open + 1..close];
        let choices = brace_choices(body).map_err(|p| list_error(pattern, p))?;
        if out.len().saturating_mul(choices.len()) > MAX_EXPANSION {
            return Err(list_error(
                pattern,
                format!("expands to more than {MAX_EXPANSION} names; check the ranges"),
            ));
        }
        let prefix = &rest[..open];
        out = out
            .iter()
            .flat_map(|head| choices.iter().map(move |c| format!("{head}{prefix}{c}")))
            .collect();
        rest = &rest[close + 1..];
    }
    for s in &mut out {
        s.push_str(rest);
    }
    Ok(out)
}

fn brace_choices(body: &str) -> std::result::Result<Vec<String>, String> {
    if let Some((a, b)) = body.split_once("..") {
        let parse = |s: &str| {
            s.parse::<u64>().map_err(|_| {
                format!("`{{{body}}}`: `{s}` is not a whole number; a range is `{{first..last}}`")
            })
        };
        let (x, y) = (parse(a)?, parse(b)?);
        let padded = (a.len() > 1 && a.starts_with('0')) || (b.len() > 1 && b.starts_with('0'));
        let width = if padded { a.len().max(b.len()) } else { 0 };
        let n = x.abs_diff(y).saturating_add(1);
        if n > MAX_EXPANSION as u64 {
            return Err(format!("`{{{body}}}` is more than {MAX_EXPANSION} names"));
        }
        let numbers: Vec<u64> = if x <= y {
            (x..=y).collect()
        } else {
            (y..=x).rev().collect()
        };
        return Ok(numbers
            .into_iter()
            .map(|v| format!("{v:0width$}"))
            .collect());
    }
    Ok(body.split(',').map(str::to_owned).collect())
}

/// The files a glob names, sorted; a pattern without `*` or `?` is itself.
fn expand_glob(pattern: &str) -> Result<Vec<PathBuf>> {
    if !pattern.contains(['*', '?']) {
        return Ok(vec![PathBuf::from(pattern)]);
    }
    let path = Path::new(pattern);
    let mut found = vec![PathBuf::new()];
    for component in path.components() {
        let text = component.as_os_str().to_string_lossy();
        if !text.contains(['*', '?']) {
            for f in &mut found {
                f.push(component);
            }
            continue;
        }
        let chars: Vec<char> = text.chars().collect();
        let mut next = Vec::new();
        for dir in &found {
            let read = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir.as_path()
            };
            let Ok(entries) = std::fs::read_dir(read) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let hidden = name.starts_with('.') && !text.starts_with('.');
                if !hidden && glob_match(&chars, &name.chars().collect::<Vec<_>>()) {
                    next.push(dir.join(name));
                }
            }
        }
        next.sort();
        found = next;
    }
    if found.is_empty() {
        return Err(list_error(pattern, "the glob matches no file"));
    }
    Ok(found)
}

/// Expands shard patterns (braces first, then globs), in the order given.
///
/// # Errors
///
/// As [`expand_braces`]; a glob that matches no file.
pub(crate) fn expand<S: AsRef<str>>(patterns: impl IntoIterator<Item = S>) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for pattern in patterns {
        for name in expand_braces(pattern.as_ref())? {
            out.extend(expand_glob(&name)?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_expand_padded_ranges_and_lists() {
        let v = expand_braces("t-{08..11}.tar").unwrap();
        assert_eq!(v, ["t-08.tar", "t-09.tar", "t-10.tar", "t-11.tar"]);
        let v = expand_braces("{9..11}").unwrap();
        assert_eq!(v, ["9", "10", "11"]);
        let v = expand_braces("{2..0}{x,y}").unwrap();
        assert_eq!(v, ["2x", "2y", "1x", "1y", "0x", "0y"]);
        assert!(expand_braces("a{1..").is_err());
        assert!(expand_braces("{a..3}").is_err());
        assert!(expand_braces("{0..99999999999}").is_err());
    }

    #[test]
    fn globs_match_stars_and_marks() {
        let m = |p: &str, n: &str| {
            glob_match(
                &p.chars().collect::<Vec<_>>(),
                &n.chars().collect::<Vec<_>>(),
            )
        };
        assert!(m("train-*.tar", "train-0001.tar"));
        assert!(m("*", "x"));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "ac"));
        assert!(!m("*.tar", "x.tar.gz"));
        assert!(m("*a*b", "xxaab"));
    }
}
