use pinnable::{Pinnable, Tensor};

// A skipped field of a parameter type needs `Clone`, which the derive does not infer.
#[derive(Pinnable)]
struct Tagged<M> {
    images: Tensor,
    #[pinnable(skip)]
    meta: M,
}

fn main() {}
