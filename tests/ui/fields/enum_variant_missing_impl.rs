use pinnable::{Tensor, ToDevice};

struct Audio;

#[derive(ToDevice)]
enum Sample {
    Image(Tensor),
    Clip { audio: Audio, len: usize },
}

fn main() {}
