use pinnable::{Pinnable, Tensor};

#[derive(Pinnable)]
#[pinnable(crate = 3)]
struct Batch {
    images: Tensor,
}

fn main() {}
