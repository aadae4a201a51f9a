use pinnable::Pinnable;

#[derive(Pinnable)]
#[pinnable(bound = T: Pinnable)]
struct Unquoted<T> {
    x: T,
}

#[derive(Pinnable)]
#[pinnable(bound = "T Pinnable")]
struct NotAPredicate<T> {
    x: T,
}

fn main() {}
