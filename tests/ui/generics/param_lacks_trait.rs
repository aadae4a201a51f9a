use pinnable::Pinnable;

#[derive(Pinnable)]
struct Padded<T> {
    items: Vec<T>,
    len: usize,
}

struct Frame;

fn pin<T: Pinnable>(_: &T) {}

fn main() {
    let batch = Padded {
        items: vec![Frame],
        len: 1,
    };
    pin(&batch);
}
