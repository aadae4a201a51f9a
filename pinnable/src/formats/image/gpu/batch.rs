//! The codec's device path: a batch of encoded images decoded and transformed on the GPU.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, OnceLock};

use cudarc::driver::result;

use super::backend::{Backend, engine_turn};
use super::inputs::Inputs;
use super::memory::{device_buffer, upload, written_on};
use super::notice::{ENGINE_STRIKES, nv_error, say_engines_failed, say_forced};
use super::nvjpeg::{self, ImageDesc, Library};
use super::plan::{Job, probe};
use super::worker::{Worker, with_worker};
use super::{JpegDecoder, chosen_decoder};
use crate::alloc::{Fence, PinnedBlock};
use crate::cuda::{CudaDevice, Device, Event, image_kernels};
use crate::error::{Error, Result};
use crate::formats::image::ImageCodec;
use crate::formats::image::decode::jpeg_looks_whole;
use crate::loader::Collator;
use crate::tensor::{Arena, Tensor};

/// Threads a block of the image kernels.
const BLOCK: u32 = 256;
/// Blocks a picture, at most.
const MAX_BLOCKS: u32 = 1024;
/// Alignment of each picture's part of the device buffers.
const ALIGN: usize = 256;

/// How a picture is decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Hardware,
    Cuda,
    /// On the host; its upright pixels at this offset of the host staging.
    Host(usize),
}

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// The batch of `inputs`, transformed as `codec` says, made on `device` by this thread's
/// decoders (created on its first batch for `device`, kept from batch to batch and epoch to
/// epoch).
pub(crate) fn make(
    codec: &ImageCodec,
    device: &Device,
    inputs: Inputs,
    c: &mut Collator,
) -> Result<(Tensor, Tensor)> {
    codec.transform.validate()?;
    let dev = device.cuda_device("ImageCodec on the GPU")?.clone();
    let decoder = match codec.decoder {
        Some(forced) => {
            say_forced(dev.ordinal, forced);
            forced
        }
        None => chosen_decoder(device),
    };
    with_worker(&dev, |worker| {
        run(codec, worker, &dev, decoder, &codec.transform, inputs, c)
    })
}

#[allow(clippy::too_many_arguments)]
fn run(
    codec: &ImageCodec,
    worker: &mut Worker,
    dev: &Arc<CudaDevice>,
    decoder: JpegDecoder,
    transform: &crate::formats::image::Transform,
    inputs: Inputs,
    c: &mut Collator,
) -> Result<(Tensor, Tensor)> {
    let n = inputs.names.len();
    dev.ctx
        .bind_to_thread()
        .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
    if n > 65535 {
        return Err(Error::Config {
            setting: "batch_size",
            problem: format!("{n} images in a batch; the device path takes at most 65535"),
        });
    }
    let lib = match decoder {
        JpegDecoder::Cpu => None,
        _ => Some(
            Library::get().map_err(|why| nv_error(format!("{decoder} was forced, but {why}")))?,
        ),
    };
    if let Some(lib) = lib {
        if decoder == JpegDecoder::Hardware && worker.hardware.is_none() {
            worker.hardware = Some(
                Backend::open(lib, nvjpeg::BACKEND_HARDWARE)
                    .map_err(|(m, _)| nv_error(format!("{m}; use JpegDecoder::Cuda or Cpu")))?,
            );
        }
        if worker.cuda.is_none() {
            worker.cuda =
                Some(Backend::open(lib, nvjpeg::BACKEND_DEFAULT).map_err(|(m, _)| nv_error(m))?);
        }
    }
    let (input, ranges) = (&inputs.block, &inputs.ranges);
    // SAFETY: the block is ours, filled above, and only read from here on.
    let bytes = unsafe { std::slice::from_raw_parts(input.as_ptr(), input.len()) };
    let file = |i: usize| &bytes[ranges[i].0..][..ranges[i].1];

    // Headers, routes and the plan of every picture.
    let mut host_px: Vec<u8> = Vec::new();
    let mut routes = Vec::with_capacity(n);
    worker.jobs.clear();
    for pos in 0..n {
        let name = &inputs.names[pos];
        let info = probe(file(pos)).filter(|i| {
            lib.is_some()
                && i.for_nvjpeg()
                && i.width.saturating_mul(i.height) <= inputs.max_pixels
                && !codec.host_share(pos)
                && jpeg_looks_whole(file(pos), i.width, i.height)
                && worker
                    .cuda
                    .as_ref()
                    .is_some_and(|b| b.image_size(file(pos)) == Some((i.width, i.height)))
        });
        let rng = c.sample_rng(pos);
        let route = match info {
            Some(info) => {
                let engines = decoder == JpegDecoder::Hardware
                    && worker.engine_failures < ENGINE_STRIKES
                    && worker
                        .hardware
                        .as_ref()
                        .is_some_and(|b| b.batched_supported(file(pos)));
                worker
                    .jobs
                    .push(transform, (info.width, info.height), info.orientation, rng)
                    .map_err(|e| inputs.error(pos, e))?;
                if engines {
                    Route::Hardware
                } else {
                    Route::Cuda
                }
            }
            None => {
                worker.host.max_pixels = inputs.max_pixels;
                let image = worker
                    .host
                    .decode(file(pos), name)
                    .map_err(|e| inputs.error(pos, e))?;
                let at = host_px.len();
                host_px.extend_from_slice(image.pixels());
                worker
                    .jobs
                    .push(transform, (image.width(), image.height()), 1, rng)
                    .map_err(|e| inputs.error(pos, e))?;
                Route::Host(at)
            }
        };
        routes.push(route);
    }
    let labels = c.stack_scalars("labels", inputs.labels.iter().copied())?;
    let mut collated = c.finish()?;
    let labels = collated.take(labels)?;

    // nvJPEG writes planar RGB (as torchvision asks it to; interleaved measured no faster on
    // the engines); the host's pictures are interleaved.
    for (j, r) in worker.jobs.jobs.iter_mut().zip(&routes) {
        if matches!(r, Route::Hardware | Route::Cuda) {
            j.set_planar();
        }
    }
    let output = nvjpeg::OUTPUT_RGB;
    let desc = |j: &Job| ImageDesc::rgb_planes(j.src, j.src_w as usize, j.src_h as usize);

    // Device memory: the decoded pictures, the filtered rows, the tables, the output.
    let size = transform.shape()[1];
    let dtype = transform.dtype();
    let jobs = &mut worker.jobs;
    let mut src_at = Vec::with_capacity(n);
    let mut mid_at = Vec::with_capacity(n);
    let (mut src_total, mut mid_total) = (0usize, 0usize);
    for j in &jobs.jobs {
        src_at.push(src_total);
        src_total += align(j.src_bytes());
        mid_at.push(mid_total);
        mid_total += align(j.mid_bytes());
    }
    let table = transform.table_bytes();
    let jobs_bytes = align(n * std::mem::size_of::<Job>());
    let taps_bytes = align(jobs.taps.len() * 4);
    let params_total = jobs_bytes + taps_bytes + table.len();
    let out_bytes = n * 3 * size * size * dtype.size();
    let stream = worker.stream.clone();
    let decoded = worker.decoded.get(dev, &stream, src_total)?;
    let mid = worker.mid.get(dev, &stream, mid_total)?;
    let params = worker.params.get(dev, &stream, params_total)?;
    let out = device_buffer(dev, &stream, out_bytes)?;
    for (k, j) in jobs.jobs.iter_mut().enumerate() {
        j.src = decoded + src_at[k] as u64;
        j.mid = mid + mid_at[k] as u64;
    }

    // Decoding: the engines' batch first, then one by one, then the host's pictures.
    let mut keep: Vec<PinnedBlock> = Vec::new();
    let hw: Vec<usize> = (0..n).filter(|&i| routes[i] == Route::Hardware).collect();
    if !hw.is_empty() {
        let b = worker
            .hardware
            .as_mut()
            .expect("opened for the hardware decoder");
        let mut data: Vec<*const u8> = hw.iter().map(|&i| file(i).as_ptr()).collect();
        let lengths: Vec<usize> = hw.iter().map(|&i| file(i).len()).collect();
        let mut descs: Vec<ImageDesc> = hw.iter().map(|&i| desc(&jobs.jobs[i])).collect();
        let mut status = nvjpeg::SUCCESS;
        if b.batch != hw.len() {
            // SAFETY: the handle and state are live and this thread's.
            status = unsafe {
                (b.lib.api.batched_initialize)(b.handle, b.state, hw.len() as c_int, 1, output)
            };
            if status == nvjpeg::SUCCESS {
                b.batch = hw.len();
            }
        }
        if status == nvjpeg::SUCCESS {
            // The engines write the destinations when the call is made, not in the stream's
            // order (found by torchcodec on nvJPEG 12.3 to 13.2, against the documented
            // contract): the last batch's kernels read the same scratch, so they must be done
            // first. Wait for the stream on the host (they are short, and usually done by now),
            // asleep rather than spinning a core.
            worker
                .idle
                .record(&stream)
                .map_err(|e| Error::driver("cuEventRecord", e))?;
            worker
                .idle
                .synchronize()
                .map_err(|e| Error::driver("cuEventSynchronize", e))?;
            let _turn = engine_turn(dev.ordinal, codec.engine_threads);
            // SAFETY: `data` and `lengths` name the files' bytes in the pinned block, which
            // lives until the stream passes this batch (its fence is recorded below); each
            // destination is a picture's part of `decoded`, whose allocation and every
            // earlier use the stream finished above.
            status = unsafe {
                (b.lib.api.decode_batched)(
                    b.handle,
                    b.state,
                    data.as_mut_ptr().cast_const(),
                    lengths.as_ptr(),
                    descs.as_mut_ptr(),
                    stream.cu_stream(),
                )
            };
        }
        if status == nvjpeg::SUCCESS {
            worker.engine_failures = 0;
        } else {
            b.batch = 0;
            worker.engine_failures += 1;
            let given_up = worker.engine_failures >= ENGINE_STRIKES;
            say_engines_failed(&nvjpeg::status_name(status), given_up);
            for &i in &hw {
                routes[i] = Route::Cuda;
            }
        }
    }
    for (i, route) in routes.iter_mut().enumerate() {
        if *route != Route::Cuda {
            continue;
        }
        let b = worker.cuda.as_mut().expect("opened for nvJPEG decoders");
        let j = jobs.jobs[i];
        let mut one = desc(&j);
        let f = file(i);
        // SAFETY: as for the batched call; one picture.
        let status = unsafe {
            (b.lib.api.decode)(
                b.handle,
                b.state,
                f.as_ptr(),
                f.len(),
                output,
                &mut one,
                stream.cu_stream(),
            )
        };
        if status == nvjpeg::SUCCESS {
            continue;
        }
        // nvJPEG refused it: the host decodes it, or names the file and why.
        let name = &inputs.names[i];
        worker.host.max_pixels = inputs.max_pixels;
        let image = worker
            .host
            .decode(f, name)
            .map_err(|e| inputs.error(i, e))?;
        let (uw, uh) = if j.orient >= 5 {
            (j.src_h, j.src_w)
        } else {
            (j.src_w, j.src_h)
        };
        if (image.width(), image.height()) != (uw as usize, uh as usize) {
            return Err(inputs.error(
                i,
                Error::Image {
                    path: name.display().to_string(),
                    problem: format!(
                        "nvJPEG refused it ({}) and the host decoder makes it {} × {}, not the \
                         {uw} × {uh} its headers say",
                        nvjpeg::status_name(status),
                        image.width(),
                        image.height()
                    ),
                },
            ));
        }
        let at = host_px.len();
        host_px.extend_from_slice(image.pixels());
        let j = &mut jobs.jobs[i];
        (j.src_w, j.src_h, j.orient) = (uw, uh, 1);
        j.set_interleaved();
        *route = Route::Host(at);
    }
    if !host_px.is_empty() {
        let staging = c.pool().alloc(host_px.len())?;
        // SAFETY: the block is ours and at least as long.
        unsafe { std::ptr::copy_nonoverlapping(host_px.as_ptr(), staging.as_ptr(), host_px.len()) };
        for (route, j) in routes.iter().zip(&jobs.jobs) {
            if let Route::Host(at) = *route {
                // SAFETY: the staging block lives until the stream passes this batch (fence
                // below); the destination is the picture's part of `decoded`.
                unsafe { upload(&stream, j.src, staging.as_ptr().add(at), j.src_bytes())? };
            }
        }
        keep.push(staging);
    }

    // The kernels' tables, then the two launches.
    let host_params = c.pool().alloc(params_total)?;
    // SAFETY: the block is ours and `params_total` long; `Job` is plain `repr(C)` data.
    unsafe {
        let p = host_params.as_ptr();
        std::ptr::copy_nonoverlapping(
            jobs.jobs.as_ptr().cast::<u8>(),
            p,
            n * std::mem::size_of::<Job>(),
        );
        std::ptr::copy_nonoverlapping(
            jobs.taps.as_ptr().cast::<u8>(),
            p.add(jobs_bytes),
            jobs.taps.len() * 4,
        );
        std::ptr::copy_nonoverlapping(table.as_ptr(), p.add(jobs_bytes + taps_bytes), table.len());
        upload(&stream, params, p, params_total)?;
    }
    keep.push(host_params);
    let kernels = image_kernels(dev)
        .map_err(|why| nv_error(format!("the image kernels cannot load: {why}")))?;
    let mut jobs_ptr = params;
    let mut taps_ptr = params + jobs_bytes as u64;
    let mut table_ptr = taps_ptr + taps_bytes as u64;
    let mut out_ptr = out.device_ptr();
    let mut size32 = size as u32;
    let most_mid = jobs
        .jobs
        .iter()
        .map(|j| j.span_rows * j.ncols)
        .max()
        .unwrap_or(0);
    let blocks = |work: u64| (work.div_ceil(u64::from(BLOCK)) as u32).clamp(1, MAX_BLOCKS);
    let out_fn = match dtype.size() {
        1 => kernels.out[0],
        2 => kernels.out[1],
        _ => kernels.out[2],
    };
    dev.ctx
        .bind_to_thread()
        .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
    {
        let mut args: [*mut c_void; 2] = [(&raw mut jobs_ptr).cast(), (&raw mut taps_ptr).cast()];
        // SAFETY: the arguments are `image_rows`'s, in order; the jobs point into `decoded`
        // and `mid`, written or reserved before on this stream, and stay inside them.
        unsafe {
            result::launch_kernel(
                kernels.rows.0,
                (blocks(u64::from(most_mid)), n as u32, 1),
                (BLOCK, 1, 1),
                0,
                stream.cu_stream(),
                &mut args,
            )
        }
        .map_err(|e| Error::driver("cuLaunchKernel(image_rows)", e))?;
        let mut args: [*mut c_void; 5] = [
            (&raw mut jobs_ptr).cast(),
            (&raw mut taps_ptr).cast(),
            (&raw mut table_ptr).cast(),
            (&raw mut out_ptr).cast(),
            (&raw mut size32).cast(),
        ];
        // SAFETY: as above; the output holds `n × 3 × size²` elements of the table's size.
        unsafe {
            result::launch_kernel(
                out_fn.0,
                (blocks((size * size) as u64), n as u32, 1),
                (BLOCK, 1, 1),
                0,
                stream.cu_stream(),
                &mut args,
            )
        }
        .map_err(|e| Error::driver("cuLaunchKernel(image_out)", e))?;
    }

    written_on(&out, &stream)?;
    // Done on the stream: the output's ready event (the scratch is reused in the stream's
    // order; the pinned blocks are fenced by the event).
    let (ready, _) = Event::record_on(dev, &stream)?;
    let ready = Arc::new(ready);
    input.record_use(ready.clone() as Arc<dyn Fence>);
    for b in &keep {
        b.record_use(ready.clone() as Arc<dyn Fence>);
    }
    let arena = Arena::device_shared(out, &Arc::new(OnceLock::from(ready)));
    let images = arena.tensor(dtype, &[n, 3, size, size], 0)?;
    Ok((images, labels))
}
