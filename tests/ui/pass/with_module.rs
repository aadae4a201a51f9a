use pinnable::{Pinnable, Tensor, ToDevice};

/// A foreign type: no impls of its own.
struct Mask(Tensor);

mod mask {
    use pinnable::{MoveContext, PinContext, Pinnable, Result, ToDevice};

    pub fn pin_with(m: &super::Mask, cx: &mut PinContext<'_>) -> Result<super::Mask> {
        Ok(super::Mask(m.0.pin_with(cx)?))
    }

    pub fn to_device_with(m: &super::Mask, cx: &mut MoveContext<'_>) -> Result<super::Mask> {
        Ok(super::Mask(m.0.to_device_with(cx)?))
    }
}

#[derive(Pinnable, ToDevice)]
struct Batch<M> {
    // `with` fields add no bound on `M`.
    #[pinnable(with = mask)]
    mask: Mask,
    #[pinnable(skip, bound = "M: Clone")]
    meta: M,
}

struct NotPinnable;
impl Clone for NotPinnable {
    fn clone(&self) -> Self {
        NotPinnable
    }
}

fn main() {
    let b = Batch {
        mask: Mask(Tensor::from_vec1(vec![true, false])),
        meta: NotPinnable,
    };
    let p = b.pin_memory().unwrap();
    assert!(p.mask.0.is_pinned());
}
