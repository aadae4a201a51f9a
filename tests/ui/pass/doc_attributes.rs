// The attributes example of the pinnable-derive crate docs, kept compiling.
use std::marker::PhantomData;
use pinnable::{Pinnable, Tensor};

/// A label set from another crate: no `Pinnable` impl of its own.
pub struct Labels(pub Tensor);

mod labels {
    use pinnable::{MoveContext, PinContext, Pinnable, Result, ToDevice};

    pub fn pin_with(l: &super::Labels, cx: &mut PinContext<'_>) -> Result<super::Labels> {
        Ok(super::Labels(l.0.pin_with(cx)?))
    }

    pub fn to_device_with(l: &super::Labels, cx: &mut MoveContext<'_>) -> Result<super::Labels> {
        Ok(super::Labels(l.0.to_device_with(cx)?))
    }
}

#[derive(Pinnable)]
struct Batch<T, M> {
    inputs: Vec<T>,                 // infers `T: Pinnable`
    #[pinnable(with = labels)]
    labels: Labels,
    #[pinnable(skip, bound = "M: Clone")]
    meta: M,                        // cloned; needs `M: Clone`, not `M: Pinnable`
    marker: PhantomData<fn() -> T>, // no bound from `PhantomData`
}

fn main() -> pinnable::Result<()> {
    let batch = Batch {
        inputs: vec![Tensor::from_vec1(vec![1.0f32, 2.0])],
        labels: Labels(Tensor::from_vec1(vec![3i64])),
        meta: "run 7",
        marker: PhantomData,
    };
    let pinned = batch.pin_memory()?;
    assert!(pinned.inputs[0].is_pinned() && pinned.labels.0.is_pinned());
    assert_eq!(pinned.meta, "run 7");
    Ok(())
}
