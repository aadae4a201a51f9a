use pinnable::{Pinnable, Tensor, ToDevice};

#[derive(Clone, PartialEq, Debug)]
struct Tokenizer(String);

#[derive(Pinnable, ToDevice)]
struct Batch {
    images: Tensor,
    #[pinnable(skip)]
    tokenizer: Tokenizer,
}

fn main() {
    let b = Batch {
        images: Tensor::from_vec1(vec![1.0f32]),
        tokenizer: Tokenizer("bpe".into()),
    };
    let p = b.pin_memory().unwrap();
    assert_eq!(p.tokenizer, b.tokenizer);
}
