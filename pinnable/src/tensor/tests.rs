//! Host-side unit tests of tensors (views, gathers, copy-on-write, borrowed bytes): no OS or
//! driver call, so Miri can run them.

use std::sync::Arc;

use super::*;
use crate::alloc::{PinnedPool, PoolConfig};
use crate::batch::BatchLayout;

#[test]
fn views_share_storage_and_gather_in_row_major_order() {
    let t = Tensor::from_vec((0..24).collect::<Vec<i64>>(), &[2, 3, 4]).unwrap();
    let tt = t.transpose(0, 2).unwrap();
    assert_eq!(tt.shape(), &[4, 3, 2]);
    assert!(tt.shares_storage_with(&t) && !tt.is_contiguous());
    assert_eq!(tt.to_vec::<i64>().unwrap()[..6], [0, 12, 4, 16, 8, 20]);
    let n = t.narrow(1, 1, 2).unwrap();
    assert_eq!(
        n.to_vec::<i64>().unwrap(),
        [4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23]
    );
    let s = t.select(2, 3).unwrap();
    assert_eq!(s.shape(), &[2, 3]);
    assert_eq!(s.to_vec::<i64>().unwrap(), [3, 7, 11, 15, 19, 23]);
    assert!(t.select(0, 2).is_err() && t.select(3, 0).is_err());
    assert!(t.narrow(1, 2, 2).is_err());
    assert_eq!(t.reshape(&[6, 4]).unwrap().shape(), &[6, 4]);
    assert!(tt.reshape(&[24]).is_err());
    let c = tt.contiguous().unwrap();
    assert!(c.is_contiguous() && !c.shares_storage_with(&t));
    assert_eq!(c.to_vec::<i64>().unwrap(), tt.to_vec::<i64>().unwrap());
}

#[test]
fn writes_never_reach_another_tensor() {
    let mut a = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    let b = a.clone();
    a.as_mut_slice::<f32>().unwrap()[0] = 9.0;
    assert_eq!(
        b.to_vec::<f32>().unwrap(),
        [1.0; 4],
        "the clone kept its values"
    );
    assert_eq!(a.to_vec::<f32>().unwrap()[0], 9.0);
    // In place when unique.
    let ptr = a.as_slice::<f32>().unwrap().as_ptr();
    a.as_mut_slice::<f32>().unwrap()[1] = 8.0;
    assert_eq!(a.as_slice::<f32>().unwrap().as_ptr(), ptr);
}

#[test]
fn pinned_parts_write_in_place_unless_shared() {
    let pool = PinnedPool::heap(PoolConfig::default());
    let mut layout = BatchLayout::new();
    layout.push(DType::U32, &[3]).unwrap();
    layout.push(DType::U32, &[3]).unwrap();
    let mut batch = layout.allocate_in(&pool).unwrap();
    for mut v in batch.views_mut() {
        v.fill(5u32).unwrap();
    }
    let mut parts = batch.finish();
    let other = parts[1].clone();
    parts[0].as_mut_slice::<u32>().unwrap()[0] = 1;
    assert!(
        parts[0].shares_block_with(&parts[1]),
        "unique part: written in place"
    );
    assert_eq!(
        parts[1].pinned_block().unwrap().as_ptr(),
        parts[0].pinned_block().unwrap().as_ptr()
    );
    assert_eq!(parts[0].to_vec::<u32>().unwrap(), [1, 5, 5]);
    assert_eq!(other.to_vec::<u32>().unwrap(), [5, 5, 5]);
}

#[test]
fn borrowed_bytes_are_checked_and_viewed_without_a_copy() {
    let bytes: Arc<Vec<u8>> = Arc::new((0..64).collect());
    let t = Tensor::from_host_bytes(bytes.clone(), DType::U8, &[4, 8], 32).unwrap();
    assert_eq!(
        t.select(0, 1).unwrap().to_vec::<u8>().unwrap(),
        (40..48).collect::<Vec<_>>()
    );
    assert!(Tensor::from_host_bytes(bytes.clone(), DType::U8, &[5, 8], 32).is_err());
    let bools = Arc::new(vec![0u8, 1, 2]);
    assert!(Tensor::from_host_bytes(bools.clone(), DType::Bool, &[2], 0).is_ok());
    assert!(
        Tensor::from_host_bytes(bools, DType::Bool, &[3], 0).is_err(),
        "2 is no bool"
    );
    // A write goes to a private copy; the borrowed bytes stay as they were.
    let mut w = Tensor::from_host_bytes(bytes.clone(), DType::U8, &[4], 0).unwrap();
    w.as_mut_slice::<u8>().unwrap()[0] = 200;
    assert_eq!(bytes[0], 0);
    assert_eq!(w.to_vec::<u8>().unwrap(), [200, 1, 2, 3]);
}
