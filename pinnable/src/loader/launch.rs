//! Data-parallel runs: the rank, world size and local rank that launchers (`torchrun`,
//! `mpirun` wrappers, Slurm scripts) put in the environment. We read them; we write no cluster
//! code of our own.

use crate::cuda::Device;
use crate::error::{Error, Result};

/// Where this process sits in a data-parallel run: one process per GPU, told its place by the
/// launcher through `RANK`, `WORLD_SIZE` and `LOCAL_RANK`.
///
/// # Examples
///
/// ```
/// use pinnable::loader::Launch;
///
/// let env = [("RANK", "5"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1")];
/// let launch = Launch::from_lookup(|k| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))?;
/// assert_eq!(launch, Launch { rank: 5, world: 8, local_rank: 1 });
/// // Without the variables: a single process.
/// assert_eq!(Launch::from_lookup(|_| None)?, Launch::single());
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// This process's rank among all processes (`RANK`).
    pub rank: usize,
    /// The number of processes (`WORLD_SIZE`).
    pub world: usize,
    /// This process's rank on its machine (`LOCAL_RANK`): the GPU it uses.
    pub local_rank: usize,
}

impl Launch {
    /// A run of one process.
    pub fn single() -> Self {
        Launch {
            rank: 0,
            world: 1,
            local_rank: 0,
        }
    }

    /// Reads `RANK`, `WORLD_SIZE` and `LOCAL_RANK` from the environment. With none of them
    /// set, a single process; `LOCAL_RANK` defaults to 0.
    ///
    /// # Errors
    ///
    /// As [`from_lookup`](Self::from_lookup).
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// As [`from_env`](Self::from_env), with `lookup(name)` in place of the environment.
    ///
    /// # Errors
    ///
    /// [`Error::Launcher`] if a variable is not a number, only one of `RANK` and `WORLD_SIZE`
    /// is set, the world size is 0, or the rank is not below it.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let read = |variable: &'static str| -> Result<Option<usize>> {
            let Some(value) = lookup(variable) else {
                return Ok(None);
            };
            value.trim().parse().map(Some).map_err(|_| Error::Launcher {
                variable,
                problem: format!("{value:?} is not a non-negative whole number"),
            })
        };
        let (rank, world, local) = (read("RANK")?, read("WORLD_SIZE")?, read("LOCAL_RANK")?);
        let (rank, world) = match (rank, world) {
            (None, None) => (0, 1),
            (Some(r), Some(w)) => (r, w),
            (Some(_), None) => {
                return Err(Error::Launcher {
                    variable: "WORLD_SIZE",
                    problem: "RANK is set but WORLD_SIZE is not; set both (or neither)".into(),
                });
            }
            (None, Some(_)) => {
                return Err(Error::Launcher {
                    variable: "RANK",
                    problem: "WORLD_SIZE is set but RANK is not; set both (or neither)".into(),
                });
            }
        };
        if world == 0 || rank >= world {
            return Err(Error::Launcher {
                variable: "RANK",
                problem: format!("rank {rank} is not below the world size {world}"),
            });
        }
        Ok(Launch {
            rank,
            world,
            local_rank: local.unwrap_or(0),
        })
    }

    /// The GPU this process uses: `cuda:LOCAL_RANK`.
    ///
    /// # Errors
    ///
    /// [`Error::CudaUnavailable`] naming `LOCAL_RANK` when there is no such device (or no
    /// CUDA at all).
    pub fn device(&self) -> Result<Device> {
        Device::cuda(self.local_rank).map_err(|e| match e {
            Error::CudaUnavailable { reason } => Error::CudaUnavailable {
                reason: format!(
                    "LOCAL_RANK={} asks for cuda:{}, but {reason}",
                    self.local_rank, self.local_rank
                ),
            },
            other => other,
        })
    }
}

impl Default for Launch {
    fn default() -> Self {
        Launch::single()
    }
}
