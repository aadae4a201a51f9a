use pinnable::{Pinnable, Tensor};

// Every mistake is reported in one build, and nothing else.
#[derive(Pinnable)]
#[pinnable(crate = pinnable, crate = pinnable)]
struct Batch {
    #[pinnable(skip = true)]
    images: Tensor,
    #[pinnable(with = m, colour = "red")]
    labels: Tensor,
    #[pinnable]
    extra: Tensor,
}

fn pin<T: Pinnable>() {}

fn main() {
    pin::<Batch>();
}
