//! Nothing: this package exists for its tests, example and bench (see Cargo.toml).
