//! NUMA placement: on a host with several memory nodes, a GPU's pinned memory and the threads
//! that fill it belong on the node its PCIe link hangs off.
//!
//! A [`Topology`] says which node a PCI device sits on and which CPUs each node has. The real
//! one reads sysfs ([`Sysfs`]); tests and unusual systems pass their own. [`affinity_for`]
//! turns a device into the node and CPUs to use, or `None` where placement does not matter
//! (one node, or a device whose node the kernel does not know). Then:
//! - a pool with [`PoolConfig::numa_node`](crate::PoolConfig::numa_node) places its fresh
//!   blocks on that node (the kernel's preferred-node policy on each mapping, before it is
//!   faulted in);
//! - [`bind_current_thread`] keeps a thread on the node's CPUs.
//!
//! The [loader](crate::loader) does both for the device it feeds ([`device_affinity`]): its own
//! pool is placed on the device's node and its threads run on that node's CPUs.
//!
//! On a host with one node (every machine these figures were taken on), there is nothing to
//! place and all of this is skipped. On a two-socket host, memory a GPU's DMA reads from the
//! far socket crosses the socket link on every copy; that cost was not measured here.
//!
//! ```
//! use pinnable::numa::{Sysfs, Topology, affinity_for};
//!
//! let topology = Sysfs::new();
//! if let Some(a) = affinity_for(&topology, "0000:17:00.0") {
//!     println!("node {} with CPUs {:?}", a.node, a.cpus);
//! }
//! println!("{} node(s)", topology.nodes());
//! ```

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where devices and CPUs sit among a host's memory nodes.
pub trait Topology {
    /// How many memory nodes the host has (at least 1).
    fn nodes(&self) -> usize;
    /// The node of the PCI device at `bus_id` (`0000:17:00.0`), if the system says.
    fn node_of_pci(&self, bus_id: &str) -> Option<usize>;
    /// The CPUs of node `node`, ascending.
    fn cpus_of(&self, node: usize) -> Vec<usize>;
}

/// The topology the kernel describes under a sysfs root (`/sys` by default; tests point it at a
/// folder of their own).
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs::new()
    }
}

impl Sysfs {
    /// The running system's topology, read from `/sys`.
    pub fn new() -> Sysfs {
        Sysfs::at("/sys")
    }

    /// A topology read from a sysfs tree at `root`.
    pub fn at(root: impl AsRef<Path>) -> Sysfs {
        Sysfs {
            root: root.as_ref().to_path_buf(),
        }
    }

    fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(rel)).ok()
    }
}

impl Topology for Sysfs {
    fn nodes(&self) -> usize {
        let dir = self.root.join("devices/system/node");
        let count = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| {
                        let name = e.file_name();
                        let name = name.to_string_lossy();
                        name.strip_prefix("node")
                            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .count()
            })
            .unwrap_or(0);
        count.max(1)
    }

    fn node_of_pci(&self, bus_id: &str) -> Option<usize> {
        let text = self.read(&format!(
            "bus/pci/devices/{}/numa_node",
            bus_id.to_ascii_lowercase()
        ))?;
        // The kernel writes -1 when it does not know.
        text.trim()
            .parse::<i64>()
            .ok()
            .and_then(|n| usize::try_from(n).ok())
    }

    fn cpus_of(&self, node: usize) -> Vec<usize> {
        self.read(&format!("devices/system/node/node{node}/cpulist"))
            .map(|text| parse_cpu_list(&text))
            .unwrap_or_default()
    }
}

/// The most CPUs a CPU list names (what the kernel's `cpu_set_t` holds).
const MAX_CPUS: usize = 8 * std::mem::size_of::<libc::cpu_set_t>();

/// Parses a kernel CPU list such as `0-7,16-23` (empty or malformed parts are skipped; CPUs
/// beyond the 1024 a `cpu_set_t` holds are left out).
pub fn parse_cpu_list(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                    // No machine has more CPUs than a cpu_set_t can name; a larger range is
                    // not a CPU list.
                    cpus.extend(a..=b.min(MAX_CPUS - 1));
                }
            }
            None => cpus.extend(part.trim().parse::<usize>().ok().filter(|&c| c < MAX_CPUS)),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    cpus
}

/// The node a device's host-side work belongs on, and that node's CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostAffinity {
    /// The memory node.
    pub node: usize,
    /// Its CPUs, ascending.
    pub cpus: Vec<usize>,
}

/// Where the host-side work for the PCI device at `bus_id` belongs: `None` on a one-node host,
/// or when the node or its CPUs are unknown (then placement is left to the OS).
pub fn affinity_for(topology: &dyn Topology, bus_id: &str) -> Option<HostAffinity> {
    if topology.nodes() < 2 {
        return None;
    }
    let node = topology.node_of_pci(bus_id)?;
    let cpus = topology.cpus_of(node);
    (!cpus.is_empty()).then_some(HostAffinity { node, cpus })
}

/// Where `device`'s host-side work belongs on this machine (read from sysfs): `None` for the
/// host, on a one-node machine, or where the kernel does not know the device's node.
pub fn device_affinity(device: &crate::Device) -> Option<HostAffinity> {
    affinity_for(&Sysfs::new(), &device.pcie_bus_id()?)
}

/// Keeps the calling thread on those of `cpus` it may already run on, from now on.
///
/// # Errors
///
/// [`Error::Field`] naming the CPUs when none of them is allowed to this thread, or the kernel
/// refuses.
pub fn bind_current_thread(cpus: &[usize]) -> Result<()> {
    // Narrow what the thread may already use (a launcher or `taskset` may have restricted the
    // process to some CPUs): never widen it.
    let allowed = current_thread_cpus();
    let cpus: Vec<usize> = cpus
        .iter()
        .copied()
        .filter(|c| allowed.is_empty() || allowed.contains(c))
        .collect();
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET only writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    for &c in cpus.iter().filter(|&&c| c < max) {
        // SAFETY: `c` is below the set's size in bits.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 names the calling thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(Error::Field {
            path: "thread affinity".into(),
            message: format!(
                "cannot keep this thread on CPUs {cpus:?}: {} (name CPUs this process may use)",
                std::io::Error::last_os_error()
            ),
        })
    }
}

/// The CPUs the calling thread may run on.
pub fn current_thread_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid out-parameter of the size passed; 0 names the calling thread.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Vec::new();
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads inside the set.
    (0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// The cores this process may use (its affinity and CPU quota), at least 1: what the defaults
/// sized to the host (workers, receiving threads, the JPEG engines' callers) start from.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The kernel's preferred-node memory policy (`MPOL_PREFERRED` in `<numaif.h>`).
const MPOL_PREFERRED: libc::c_long = 1;

/// Asks the kernel to take the pages of `len` bytes at `ptr` (a fresh mapping, not yet faulted
/// in) from node `node`. Best effort: a kernel without NUMA support, or a node that does not
/// exist, leaves placement to the OS.
pub(crate) fn place(ptr: *mut u8, len: usize, node: usize) {
    let mut mask = [0u64; 16];
    let Some(word) = mask.get_mut(node / 64) else {
        return;
    };
    *word = 1 << (node % 64);
    // SAFETY: mbind only changes the policy of the caller's own mapping `ptr..ptr + len`; the
    // mask is valid for `maxnode` bits and outlives the call.
    unsafe {
        libc::syscall(
            libc::SYS_mbind,
            ptr,
            len,
            MPOL_PREFERRED,
            mask.as_ptr(),
            (mask.len() * 64) as libc::c_ulong,
            0 as libc::c_uint,
        );
    }
}
