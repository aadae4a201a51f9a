use pinnable::{Pinnable, Tensor};

#[derive(Pinnable)]
struct Batch {
    images: Tensor,
    #[pinnable(skip)]
    #[pinnable(skip)]
    ids: Vec<String>,
}

fn main() {}
