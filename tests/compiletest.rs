//! The derive's compile-time behaviour, as a user sees it: `tests/ui/pass/` must build and run;
//! every other `tests/ui/<topic>/` case must fail with exactly its `.stderr`.
//! Regenerate with `TRYBUILD=overwrite cargo test --test compiletest` and review the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    for topic in ["attrs", "fields", "generics", "input"] {
        t.compile_fail(format!("tests/ui/{topic}/*.rs"));
    }
}
