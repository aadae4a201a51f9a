use std::marker::PhantomData;

use pinnable::{Pinnable, Tensor, ToDevice};

// `T` appears only inside `PhantomData`: no `T: Pinnable` bound is inferred.
#[derive(Pinnable, ToDevice)]
struct Typed<T> {
    data: Tensor,
    marker: PhantomData<fn() -> T>,
}

struct Opaque;

fn pinnable<T: Pinnable + ToDevice>() {}

fn main() {
    pinnable::<Typed<Opaque>>();
}
