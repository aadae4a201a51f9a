//! The derive's compile-time behaviour, and what safe code cannot do with device views, as a
//! user sees it: `tests/ui/pass/` must build and run;
//! every other `tests/ui/<topic>/` case must fail with exactly its `.stderr`.
//! Regenerate with `TRYBUILD=overwrite cargo test --test compiletest` and review the diff.
//!
//! Run with the default features only: trybuild builds the crate again in a target of its own
//! with the same features, which would build the integrations' dependencies a second time
//! (candle's CUDA kernels alone take ~10 minutes) for cases that depend on no feature.
#![cfg(not(any(
    feature = "ndarray",
    feature = "dlpack",
    feature = "burn",
    feature = "candle",
    feature = "image",
    feature = "remote"
)))]

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    for topic in ["attrs", "fields", "generics", "input", "views"] {
        t.compile_fail(format!("tests/ui/{topic}/*.rs"));
    }
}
