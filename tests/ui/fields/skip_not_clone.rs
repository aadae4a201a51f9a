use pinnable::{Pinnable, Tensor};

struct Handle;

#[derive(Pinnable)]
struct Batch {
    images: Tensor,
    #[pinnable(skip)]
    handle: Handle,
}

fn main() {}
