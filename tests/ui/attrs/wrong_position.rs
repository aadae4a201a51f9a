use pinnable::{Pinnable, Tensor};

#[derive(Pinnable)]
#[pinnable(skip)]
enum Sample {
    #[pinnable(bound = "")]
    Image(#[pinnable(crate = pinnable)] Tensor),
}

fn main() {}
