//! The derive's compile-time behaviour, and what safe code cannot do with device views, as a
//! user sees it: `tests/ui/pass/` must build and run;
//! every other `tests/ui/<topic>/` case must fail with exactly its `.stderr`.
//! Regenerate with `TRYBUILD=overwrite cargo test --test compiletest` and review the diff.
//!
//! Not run with `candle-cuda`: trybuild builds the crate again in a target of its own with the
//! same features, which would compile candle's CUDA kernels a second time (~10 minutes) for
//! cases that do not depend on any feature. The default test run covers them.
#![cfg(not(feature = "candle-cuda"))]

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    for topic in ["attrs", "fields", "generics", "input", "views"] {
        t.compile_fail(format!("tests/ui/{topic}/*.rs"));
    }
}
