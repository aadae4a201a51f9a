//! A library author's own tensor type implementing `Pinnable` and `ToDevice` by hand with the
//! same building blocks the derive uses: field paths, the dense-CPU check, and the contexts that
//! pin or move each part.
//!
//!     cargo run --release --example sparse_coo

use pinnable::{
    Device, MoveContext, PinContext, Pinnable, Placement, Result, Tensor, ToDevice, Walk,
};
use pinnable::{TensorLayout, TensorMeta};

/// A sparse matrix in coordinate format: `indices` is i64 `[2, nnz]`, `values` is `[nnz]`.
#[derive(Clone, Debug)]
pub struct SparseCoo {
    indices: Tensor,
    values: Tensor,
    shape: [usize; 2],
}

impl SparseCoo {
    fn new(indices: Tensor, values: Tensor, shape: [usize; 2]) -> Result<SparseCoo> {
        let nnz = values.numel();
        if indices.shape() != [2, nnz] {
            return Err(pinnable::Error::Shape(format!(
                "indices must be [2, {nnz}], got {:?}",
                indices.shape()
            )));
        }
        Ok(SparseCoo {
            indices,
            values,
            shape,
        })
    }

    /// The dense matrix, for checking.
    fn to_dense(&self) -> Result<Vec<f32>> {
        let idx = self.indices.to_vec::<i64>()?;
        let vals = self.values.to_vec::<f32>()?;
        let nnz = vals.len();
        let mut out = vec![0.0; self.shape[0] * self.shape[1]];
        for k in 0..nnz {
            out[idx[k] as usize * self.shape[1] + idx[nnz + k] as usize] += vals[k];
        }
        Ok(out)
    }
}

/// The type as a whole is sparse: asking to pin it as one dense tensor is refused, which is what
/// a pipeline that expects dense tensors should hear.
impl TensorMeta for SparseCoo {
    fn dtype_name(&self) -> String {
        self.values.dtype().to_string()
    }
    fn placement(&self) -> Placement {
        self.values.placement()
    }
    fn layout(&self) -> TensorLayout {
        TensorLayout::Other("sparse COO")
    }
}

impl Pinnable for SparseCoo {
    fn pin_with(&self, cx: &mut PinContext<'_>) -> Result<Self> {
        // Each part is a dense tensor: pin it under its own field name, so an error names
        // `batch.adjacency.values`, not just `batch.adjacency`.
        let indices = cx.field("indices", |cx| self.indices.pin_with(cx))?;
        let values = cx.field("values", |cx| self.values.pin_with(cx))?;
        Ok(SparseCoo {
            indices,
            values,
            shape: self.shape,
        })
    }
}

impl ToDevice for SparseCoo {
    fn to_device_with(&self, cx: &mut MoveContext<'_>) -> Result<Self> {
        let indices = cx.field("indices", |cx| cx.move_tensor(&self.indices))?;
        let values = cx.field("values", |cx| cx.move_tensor(&self.values))?;
        Ok(SparseCoo {
            indices,
            values,
            shape: self.shape,
        })
    }
}

#[derive(Pinnable, ToDevice)]
struct GraphBatch {
    adjacency: SparseCoo,
    features: Tensor,
}

fn main() -> Result<()> {
    let coo = SparseCoo::new(
        Tensor::from_vec(vec![0i64, 1, 2, 2, /* cols */ 1, 0, 2, 0], &[2, 4])?,
        Tensor::from_vec(vec![1.5f32, -2.0, 3.25, 0.5], &[4])?,
        [3, 3],
    )?;
    let batch = GraphBatch {
        adjacency: coo,
        features: Tensor::from_vec(vec![0.1f32; 3 * 8], &[3, 8])?,
    };

    let pinned = batch.pin_memory()?;
    assert!(pinned.adjacency.indices.is_pinned() && pinned.adjacency.values.is_pinned());
    assert_eq!(pinned.adjacency.to_dense()?, batch.adjacency.to_dense()?);
    println!(
        "pinned a sparse COO matrix part by part: {:?}",
        pinned.adjacency.to_dense()?
    );

    // The dense-CPU check refuses the sparse type as a whole, naming the field and layout.
    let err = pinnable::dense_cpu(&batch.adjacency, &pinnable::FieldPath::new()).unwrap_err();
    println!("as one dense tensor it is refused: {err}");

    match Device::cuda(0) {
        Err(e) => println!("no CUDA device: {e}"),
        Ok(device) => {
            let back = pinned.to_device(&device, true)?.to_cpu(false)?;
            assert_eq!(back.adjacency.to_dense()?, batch.adjacency.to_dense()?);
            println!(
                "moved to {} ({device}) and back: values identical",
                device.name()
            );
        }
    }
    Ok(())
}
