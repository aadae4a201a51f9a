use pinnable::{Pinnable, Tensor, ToDevice};

#[derive(Pinnable, ToDevice)]
#[pinnable(rename = "b")]
struct Batch {
    #[pinnable(skipp)]
    images: Tensor,
}

fn main() {}
