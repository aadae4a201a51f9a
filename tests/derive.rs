use pinnable::{Pinnable, Tensor, ToDevice};
#[derive(Pinnable, ToDevice)]
struct Batch<'a, T, const N: usize> where T: Clone {
    images: Tensor,
    xs: [T; N],
    #[pinnable(skip)]
    name: &'a str,
}
#[derive(Pinnable, ToDevice)]
enum Sample { A, B(Tensor, i32), C { x: Tensor } }
#[derive(Pinnable, ToDevice)]
struct Unit;
#[derive(Pinnable, ToDevice)]
struct Tup(Tensor, String);
#[derive(Pinnable, ToDevice)]
enum Never {}
#[test]
fn smoke() {
    let b = Batch::<'_, Tensor, 2> { images: Tensor::from_vec1(vec![1.0f32]), xs: [Tensor::from_vec1(vec![1i64]), Tensor::from_vec1(vec![2i64])], name: "x" };
    let p = b.pin_memory().unwrap();
    assert!(p.xs[1].is_pinned());
    let _ = (Sample::A, Unit, Tup(Tensor::from_vec1(vec![1u8]), String::new()));
    let _ = Sample::C { x: Tensor::from_vec1(vec![1u8]) }.pin_memory().unwrap();
    let _ = Sample::B(Tensor::from_vec1(vec![1u8]), 1).pin_memory().unwrap();
    let _ = Unit.pin_memory();
}
