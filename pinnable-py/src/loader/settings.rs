//! The settings resolved as torch would: the device (torch's current GPU, or `cuda:LOCAL_RANK`) and
//! the ranks (`torch.distributed`, else `RANK`/`WORLD_SIZE`).

use super::*;

/// CUDA device `n`, or an error that says what to pass instead.
fn cuda(n: usize) -> PyResult<Device> {
    let count = Device::count();
    if count > 0 && n >= count {
        return Err(config_error(format!(
            "device cuda:{n} does not exist: this process sees {count} CUDA device(s), \
             cuda:0 to cuda:{}",
            count - 1
        )));
    }
    Device::cuda(n).map_err(|e| {
        error(format!(
            "{e}. To load without a GPU, pass device=\"cpu\": batches stay in pinned host memory"
        ))
    })
}

/// The GPU a loader without a device goes to: torch's current device once torch has set up
/// CUDA (`torch.cuda.set_device(rank)` under `mp.spawn`), else `LOCAL_RANK`, else 0.
fn current(py: Python<'_>) -> PyResult<usize> {
    let modules = py.import("sys")?.getattr("modules")?;
    if let Ok(torch) = modules.get_item("torch") {
        let cuda = torch.getattr("cuda")?;
        if cuda.call_method0("is_initialized")?.is_truthy()? {
            return cuda.call_method0("current_device")?.extract();
        }
    }
    match std::env::var("LOCAL_RANK") {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| config_error(format!("LOCAL_RANK={v:?} is not a device number"))),
        Err(_) => Ok(0),
    }
}

/// The device a `device=` argument names; `None` is the current GPU (see [`current`]) when
/// CUDA is there, else the host.
pub(crate) fn parse_device(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<Device> {
    let Some(d) = device.filter(|d| !d.is_none()) else {
        return if Device::is_available() {
            cuda(current(py)?)
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
        "cuda" => cuda(current(py)?),
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
