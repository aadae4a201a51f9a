use std::collections::HashMap;

use pinnable::{Pinnable, Tensor, ToDevice};

// Lifetimes, type and const parameters and a where-clause; `T: Pinnable`/`T: ToDevice` are
// inferred from `items`, `K` is only a map key.
#[derive(Pinnable, ToDevice)]
struct Batch<'a, T, K, const N: usize>
where
    K: Clone + Eq + std::hash::Hash + std::fmt::Debug,
{
    items: [Vec<T>; N],
    extra: HashMap<K, Tensor>,
    #[pinnable(skip)]
    name: &'a str,
}

fn pinnable<T: Pinnable + ToDevice>(_: &T) {}

fn main() {
    let b: Batch<'_, Tensor, u8, 2> = Batch {
        items: [vec![], vec![]],
        extra: HashMap::new(),
        name: "b",
    };
    pinnable(&b);
}
