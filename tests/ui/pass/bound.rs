use std::rc::Rc;

use pinnable::{Pinnable, ToDevice};

// The container bound replaces the inferred `T: Pinnable`; `Rc<T>` needs exactly that anyway,
// and the explicit form documents it.
#[derive(Pinnable, ToDevice)]
#[pinnable(bound = "T: Pinnable + ToDevice")]
struct Shared<T> {
    value: Rc<T>,
}

// An empty bound: no predicates at all, so this holds for any `T` (only `PhantomData` uses it).
#[derive(Pinnable, ToDevice)]
#[pinnable(bound = "")]
struct Marker<T> {
    marker: std::marker::PhantomData<T>,
}

struct Opaque;

fn pinnable<T: Pinnable + ToDevice>() {}

fn main() {
    pinnable::<Shared<pinnable::Tensor>>();
    pinnable::<Marker<Opaque>>();
}
