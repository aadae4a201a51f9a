use pinnable::{Pinnable, Tensor, ToDevice};

#[derive(Pinnable, ToDevice)]
enum Sample<T> {
    Empty,
    Single(T),
    Pair(Tensor, Box<Sample<T>>),
    Named { image: Tensor, label: Option<i64> },
}

#[derive(Pinnable, ToDevice)]
enum Never {}

fn pinnable<T: Pinnable + ToDevice>() {}

fn main() {
    pinnable::<Sample<Tensor>>();
    pinnable::<Never>();
}
