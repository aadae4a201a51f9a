use pinnable::{Pinnable, Tensor};

#[derive(Pinnable)]
struct Quoted {
    #[pinnable(with = "my_module")]
    images: Tensor,
}

#[derive(Pinnable)]
struct Missing {
    #[pinnable(with)]
    images: Tensor,
}

fn main() {}
