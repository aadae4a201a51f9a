//! The burn tests, example and bench on burn's CUDA backend, in one binary (see Cargo.toml):
//! the repository's files, where burn's default device is now CUDA device 0, and the tests only
//! a GPU can run (`cuda.rs`).

#[path = "../../tests/burn.rs"]
mod interop;

#[path = "../../tests/burn_train.rs"]
mod learner;

#[path = "../../examples/burn_train.rs"]
mod example;

#[path = "../../benches/burn.rs"]
mod bench;

mod cuda;

/// The burn_train example, on burn's CUDA device: the crash, the resume, and the losses of
/// burn's own loader.
#[test]
fn example_burn_train() {
    if pinnable_harness::cuda_or_skip("example_burn_train").is_none() {
        return;
    }
    example::main().unwrap();
}

/// The burn bench on burn's CUDA device; run with `--ignored --nocapture bench`.
#[test]
#[ignore = "a bench, not a test: run it with --ignored"]
fn bench_burn_on_cuda() {
    bench::main();
}
