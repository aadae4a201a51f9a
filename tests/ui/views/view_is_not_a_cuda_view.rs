// A device view is ordered on the stream it was made for; as a cudarc view, another stream
// could read it before the copy that fills the tensor, and free it under the read.
use pinnable::{Device, Tensor, ToDevice};

fn main() {
    let device = Device::cuda(0).unwrap();
    let stream = device.cuda_context().unwrap().new_stream().unwrap();
    let other = device.cuda_context().unwrap().new_stream().unwrap();
    let t = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap().to_device(&device, true).unwrap();
    let view = t.cuda_view::<f32>(&stream).unwrap();
    let _ = other.clone_dtoh(&*view);
}
