//! NUMA placement against fake sysfs trees (two nodes, unknown nodes, one node), and on the
//! real machine: thread affinity and a pool placed on node 0.

use std::path::Path;

use pinnable::numa::{
    HostAffinity, Sysfs, Topology, affinity_for, bind_current_thread, current_thread_cpus,
    parse_cpu_list,
};
use pinnable::{BackendChoice, PinnedPool, PoolConfig};
use pinnable_harness::rng;
use rand::Rng;

/// A fake sysfs tree: `nodes` as (cpulist) and `gpus` as (bus id, numa_node).
fn fake_sysfs(nodes: &[&str], gpus: &[(&str, &str)]) -> tempdir::Dir {
    let dir = tempdir::Dir::new();
    for (i, cpus) in nodes.iter().enumerate() {
        let node = dir.path().join(format!("devices/system/node/node{i}"));
        std::fs::create_dir_all(&node).unwrap();
        std::fs::write(node.join("cpulist"), format!("{cpus}\n")).unwrap();
    }
    // Entries the kernel puts beside the nodes, which are not nodes.
    std::fs::create_dir_all(dir.path().join("devices/system/node/power")).unwrap();
    std::fs::write(dir.path().join("devices/system/node/possible"), "0-1\n").unwrap();
    for (bus, node) in gpus {
        let dev = dir.path().join(format!("bus/pci/devices/{bus}"));
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("numa_node"), format!("{node}\n")).unwrap();
    }
    dir
}

/// A folder under the system's temporary folder, removed when dropped.
mod tempdir {
    pub struct Dir(std::path::PathBuf);

    impl Dir {
        pub fn new() -> Dir {
            let p = std::env::temp_dir().join(format!(
                "pinnable-numa-{}-{:?}-{}",
                std::process::id(),
                std::thread::current().id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }

        pub fn path(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[test]
fn cpu_lists_parse_like_the_kernel_writes_them() {
    assert_eq!(parse_cpu_list("0-3,8-9,12\n"), vec![0, 1, 2, 3, 8, 9, 12]);
    assert_eq!(parse_cpu_list(""), Vec::<usize>::new());
    assert_eq!(parse_cpu_list("5,x,1-2"), vec![1, 2, 5]);
    let mut r = rng("cpu_lists_parse_like_the_kernel_writes_them");
    let mut cpus: Vec<usize> = (0..20).map(|_| r.random_range(0..256)).collect();
    cpus.sort_unstable();
    cpus.dedup();
    let text = cpus
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",");
    assert_eq!(parse_cpu_list(&text), cpus);
}

#[test]
fn each_gpu_gets_its_own_node_on_a_two_socket_host() {
    let dir = fake_sysfs(
        &["0-7,16-23", "8-15,24-31"],
        &[
            ("0000:17:00.0", "0"),
            ("0000:ca:00.0", "1"),
            ("0000:03:00.0", "-1"),
        ],
    );
    let t = Sysfs::at(dir.path());
    assert_eq!(t.nodes(), 2);
    let near = affinity_for(&t, "0000:17:00.0").unwrap();
    assert_eq!(
        near,
        HostAffinity {
            node: 0,
            cpus: parse_cpu_list("0-7,16-23")
        }
    );
    // Bus ids are matched whatever their case.
    let far = affinity_for(&t, "0000:CA:00.0").unwrap();
    assert_eq!(far.node, 1);
    assert_eq!(far.cpus, parse_cpu_list("8-15,24-31"));
    // The kernel does not know this device's node, nor a device that is not there.
    assert_eq!(affinity_for(&t, "0000:03:00.0"), None);
    assert_eq!(affinity_for(&t, "0000:99:00.0"), None);
}

#[test]
fn one_node_means_nothing_to_place() {
    let dir = fake_sysfs(&["0-31"], &[("0000:17:00.0", "0")]);
    let t = Sysfs::at(dir.path());
    assert_eq!(t.nodes(), 1);
    assert_eq!(affinity_for(&t, "0000:17:00.0"), None);
    // No sysfs at all reads as one node.
    assert_eq!(Sysfs::at(Path::new("/nonexistent")).nodes(), 1);
}

#[test]
fn a_thread_stays_on_the_cpus_it_is_bound_to() {
    let all = current_thread_cpus();
    assert!(!all.is_empty());
    let first = all[0];
    std::thread::spawn(move || {
        bind_current_thread(&[first]).unwrap();
        assert_eq!(current_thread_cpus(), vec![first]);
    })
    .join()
    .unwrap();
    let err = bind_current_thread(&[]).unwrap_err();
    assert!(err.to_string().contains("cannot keep this thread"), "{err}");
    assert_eq!(current_thread_cpus(), all, "a failed bind changes nothing");
}

#[test]
fn a_pool_placed_on_a_node_hands_out_working_blocks() {
    let mut r = rng("a_pool_placed_on_a_node_hands_out_working_blocks");
    let pool = PinnedPool::new(
        PoolConfig::default()
            .backend(BackendChoice::Mlock)
            .numa_node(0),
    );
    let bytes = r.random_range(1..(4 << 20));
    let block = pool.alloc(bytes).unwrap();
    let fill: u8 = r.random();
    // SAFETY: the fresh block is ours alone.
    let slice = unsafe { block.as_mut_slice() };
    slice.fill(fill);
    assert!(slice.iter().all(|&b| b == fill));
    // A node that does not exist is a preference the kernel ignores, not an error.
    let far = PinnedPool::new(
        PoolConfig::default()
            .backend(BackendChoice::Mlock)
            .numa_node(63),
    );
    assert!(far.alloc(4096).is_ok());
}

#[test]
fn binding_narrows_the_allowed_cpus_and_huge_lists_stay_bounded() {
    assert!(parse_cpu_list("0-18446744073709551615").len() <= 1024);
    let all = current_thread_cpus();
    let first = all[0];
    std::thread::spawn(move || {
        bind_current_thread(&[first]).unwrap();
        // A wider request later cannot widen what the thread was narrowed to.
        bind_current_thread(&(0..1024).collect::<Vec<_>>()).unwrap();
        assert_eq!(current_thread_cpus(), vec![first]);
        // None of these allowed: an error, and nothing changes.
        let others: Vec<usize> = (0..1024).filter(|&c| c != first).collect();
        assert!(bind_current_thread(&others).is_err());
        assert_eq!(current_thread_cpus(), vec![first]);
    })
    .join()
    .unwrap();
}
