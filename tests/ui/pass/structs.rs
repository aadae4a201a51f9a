use pinnable::{Pinnable, Tensor, ToDevice};

#[derive(Pinnable, ToDevice)]
struct Named {
    r#type: Tensor,
}

#[derive(Pinnable, ToDevice)]
struct Tuple(Tensor, (Tensor, String));

#[derive(Pinnable, ToDevice)]
struct Unit;

#[derive(Pinnable, ToDevice)]
struct Empty {}

fn pinnable<T: Pinnable + ToDevice>() {}

fn main() {
    pinnable::<Named>();
    pinnable::<Tuple>();
    pinnable::<Unit>();
    pinnable::<Empty>();
}
