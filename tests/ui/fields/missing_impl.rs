use pinnable::{Pinnable, Tensor};

struct Tokenizer;

#[derive(Pinnable)]
struct Batch {
    images: Tensor,
    tokenizer: Tokenizer,
}

fn main() {}
