// The cudarc view of a device view works on any stream, so taking it is `unsafe`.
use pinnable::{Device, Tensor, ToDevice};

fn main() {
    let device = Device::cuda(0).unwrap();
    let stream = device.cuda_context().unwrap().new_stream().unwrap();
    let mut t = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap().to_device(&device, true).unwrap();
    let view = t.cuda_view::<f32>(&stream).unwrap();
    let _ = view.as_cuda_view();
    drop(view);
    let mut view = t.cuda_view_mut::<f32>(&stream).unwrap();
    let _ = view.as_view_mut();
}
