use pinnable::Pinnable;

#[derive(Pinnable)]
union Bits {
    f: f32,
    u: u32,
}

fn pin<T: Pinnable>() {}

fn main() {
    pin::<Bits>();
}
