//! The settings resolved as torch would: the device (`cuda:LOCAL_RANK` when there is a GPU) and
//! the ranks (`torch.distributed`, else `RANK`/`WORLD_SIZE`).

use super::*;

/// CUDA device `n`, or an error that says how to stay on the host.
fn cuda(n: usize) -> PyResult<Device> {
    Device::cuda(n).map_err(|e| {
        error(format!(
            "{e}. To load without a GPU, pass device=\"cpu\": batches stay in pinned host memory"
        ))
    })
}

/// The device a `device=` argument names; `None` is `cuda:LOCAL_RANK` when CUDA is there.
pub(crate) fn parse_device(device: Option<&Bound<'_, PyAny>>) -> PyResult<Device> {
    let local = || -> PyResult<usize> {
        match std::env::var("LOCAL_RANK") {
            Ok(v) => v
                .trim()
                .parse()
                .map_err(|_| config_error(format!("LOCAL_RANK={v:?} is not a device number"))),
            Err(_) => Ok(0),
        }
    };
    let Some(d) = device.filter(|d| !d.is_none()) else {
        return if Device::is_available() {
            cuda(local()?)
        } else {
            Ok(Device::cpu())
        };
    };
    if let Ok(n) = d.extract::<usize>() {
        return cuda(n);
    }
    let name = d.str()?.to_string();
    match name.as_str() {
        "cpu" => Ok(Device::cpu()),
        "cuda" => cuda(local()?),
        _ => match name.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => cuda(n),
            _ => Err(config_error(format!(
                "device={name:?}: use \"cpu\", \"cuda\", \"cuda:N\", an int or a torch.device"
            ))),
        },
    }
}

/// Rank and world size: given, else `torch.distributed`'s when it is initialised, else
/// `RANK`/`WORLD_SIZE`.
pub(super) fn parse_ranks(
    py: Python<'_>,
    rank: Option<usize>,
    world: Option<usize>,
) -> PyResult<(usize, usize)> {
    match (rank, world) {
        (Some(r), Some(w)) => return Ok((r, w)),
        (Some(_), None) | (None, Some(_)) => {
            return Err(config_error(
                "give both rank and world_size, or neither (then torch.distributed's, or RANK \
                 and WORLD_SIZE, are used)",
            ));
        }
        (None, None) => {}
    }
    let modules = py.import("sys")?.getattr("modules")?;
    if let Ok(dist) = modules.get_item("torch.distributed")
        && dist.call_method0("is_available")?.is_truthy()?
        && dist.call_method0("is_initialized")?.is_truthy()?
    {
        let r = dist.call_method0("get_rank")?.extract()?;
        let w = dist.call_method0("get_world_size")?.extract()?;
        return Ok((r, w));
    }
    let var = |name: &str, default: usize| -> PyResult<usize> {
        match std::env::var(name) {
            Ok(v) => v
                .trim()
                .parse()
                .map_err(|_| config_error(format!("{name}={v:?} is not a number"))),
            Err(_) => Ok(default),
        }
    };
    Ok((var("RANK", 0)?, var("WORLD_SIZE", 1)?))
}
