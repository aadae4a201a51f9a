mod reexport {
    pub use pinnable as pn;
}

use reexport::pn::{Pinnable, Tensor, ToDevice};

#[derive(Pinnable, ToDevice)]
#[pinnable(crate = reexport::pn)]
struct Batch {
    images: Tensor,
}

#[derive(Pinnable, ToDevice)]
#[pinnable(crate = crate::reexport::pn)]
enum Sample {
    Image(Tensor),
}

fn main() {
    let b = Batch {
        images: Tensor::from_vec1(vec![1u8]),
    };
    assert!(b.pin_memory().unwrap().images.is_pinned());
    let Sample::Image(t) = Sample::Image(Tensor::from_vec1(vec![2u8]))
        .pin_memory()
        .unwrap();
    assert!(t.is_pinned());
}
