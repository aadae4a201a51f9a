use pinnable::{Pinnable, Tensor};

#[derive(Pinnable)]
struct Batch {
    #[pinnable(skip, with = my_module)]
    images: Tensor,
}

fn main() {}
