//! The pool's limits: the byte budget (wait, then a precise error; never over-committed;
//! woken by a free on another thread) and the `mlock` limit (`ulimit -l`).

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use pinnable::{BackendChoice, Error, PinnedPool, PoolConfig};

fn mlock_pool(config: PoolConfig) -> PinnedPool {
    let _ = pinnable::PinnedPool::raise_memlock_limit();
    PinnedPool::new(config.backend(BackendChoice::Mlock))
}

#[test]
fn over_budget_waits_for_the_configured_time_then_names_request_use_and_budget() {
    let page = pinnable::PinnedPool::rounded_size(1);
    let wait = Duration::from_millis(150);
    let pool = mlock_pool(PoolConfig::default().max_bytes(64 * page).wait(wait));
    let held = pool.alloc(40 * page).unwrap();
    let start = Instant::now();
    let err = pool.alloc(30 * page).unwrap_err();
    let took = start.elapsed();
    let Error::BudgetExceeded {
        requested,
        in_use,
        budget,
        waited,
    } = &err
    else {
        panic!("expected BudgetExceeded, got {err}");
    };
    assert_eq!(*requested, pinnable::PinnedPool::rounded_size(30 * page));
    assert_eq!((*in_use, *budget), (40 * page, 64 * page));
    assert!(
        *waited >= wait && took >= wait,
        "waited {waited:?}, took {took:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("budget {} bytes", 64 * page)),
        "{msg}"
    );
    let s = pool.stats();
    assert!(s.reserved_bytes <= 64 * page, "never over-committed\n{s}");
    assert_eq!(s.budget_waits, 1);
    drop(held);
}

#[test]
fn a_free_on_another_thread_unblocks_a_waiting_allocation() {
    let page = pinnable::PinnedPool::rounded_size(1);
    let pool = mlock_pool(
        PoolConfig::default()
            .max_bytes(32 * page)
            .wait(Duration::from_secs(30)),
    );
    let held = pool.alloc(20 * page).unwrap();
    let start = Instant::now();
    let freer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        drop(held);
    });
    let b = pool.alloc(20 * page).expect("woken by the free");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(90) && took < Duration::from_secs(10),
        "{took:?}"
    );
    let s = pool.stats();
    assert!(s.reserved_bytes <= 32 * page);
    assert_eq!(
        (s.hits, s.budget_waits),
        (1, 1),
        "the freed block itself was reused\n{s}"
    );
    drop(b);
    freer.join().unwrap();
}

#[test]
fn many_threads_never_over_commit_the_budget() {
    let page = pinnable::PinnedPool::rounded_size(1);
    let budget = 48 * page;
    let pool = mlock_pool(
        PoolConfig::default()
            .max_bytes(budget)
            .wait(Duration::from_secs(30)),
    );
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let pool = pool.clone();
            thread::spawn(move || {
                for i in 0..500 {
                    let b = pool.alloc((1 + (t + i) % 12) * page).unwrap();
                    assert!(pool.stats().reserved_bytes <= budget);
                    // SAFETY: the block is ours alone.
                    let bytes = unsafe { b.as_mut_slice() };
                    bytes[0] = t as u8;
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    pool.empty_cache();
    pinnable_harness::assert_drained(&pool);
}

// ---- the mlock limit, in a child process with a small RLIMIT_MEMLOCK and no CAP_IPC_LOCK ----

const CHILD_ENV: &str = "PINNABLE_TEST_MEMLOCK_CHILD";
const CHILD_LIMIT: u64 = 1 << 20;

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod sys {
    //! The two calls the child needs; std links the C library that provides them.

    #[repr(C)]
    struct Rlimit {
        cur: u64,
        max: u64,
    }

    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }

    unsafe extern "C" {
        fn setrlimit(resource: i32, rlim: *const Rlimit) -> i32;
        fn syscall(num: i64, ...) -> i64;
    }

    const RLIMIT_MEMLOCK: i32 = 8;
    const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    const CAP_IPC_LOCK: u32 = 14;
    #[cfg(target_arch = "x86_64")]
    const SYS_CAPGET: i64 = 125;
    #[cfg(target_arch = "x86_64")]
    const SYS_CAPSET: i64 = 126;
    #[cfg(target_arch = "aarch64")]
    const SYS_CAPGET: i64 = 90;
    #[cfg(target_arch = "aarch64")]
    const SYS_CAPSET: i64 = 91;

    /// Sets both the soft and the hard locked-memory limit.
    pub fn limit_memlock(bytes: u64) {
        let lim = Rlimit {
            cur: bytes,
            max: bytes,
        };
        // SAFETY: `lim` is a valid rlimit for the duration of the call.
        let r = unsafe { setrlimit(RLIMIT_MEMLOCK, &lim) };
        assert_eq!(r, 0, "setrlimit: {}", std::io::Error::last_os_error());
    }

    /// Drops `CAP_IPC_LOCK` from the effective and permitted sets (root bypasses the limit
    /// with it). Without it already, this changes nothing.
    pub fn drop_cap_ipc_lock() {
        let mut header = CapHeader {
            version: CAPABILITY_VERSION_3,
            pid: 0,
        };
        let mut data = [CapData::default(); 2];
        // SAFETY: header and a two-element data array, as capget(2) wants for version 3.
        let r = unsafe { syscall(SYS_CAPGET, &mut header as *mut CapHeader, data.as_mut_ptr()) };
        assert_eq!(r, 0, "capget: {}", std::io::Error::last_os_error());
        data[0].effective &= !(1 << CAP_IPC_LOCK);
        data[0].permitted &= !(1 << CAP_IPC_LOCK);
        // SAFETY: as above; capset(2) only reads them.
        let r = unsafe { syscall(SYS_CAPSET, &mut header as *mut CapHeader, data.as_ptr()) };
        assert_eq!(r, 0, "capset: {}", std::io::Error::last_os_error());
    }
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
#[test]
fn mlock_over_the_locked_memory_limit_fails_with_memlock_limit_naming_it() {
    const NAME: &str = "mlock_over_the_locked_memory_limit_fails_with_memlock_limit_naming_it";
    if std::env::var_os(CHILD_ENV).is_some() {
        // The child: a 1 MiB limit that binds even for root.
        sys::limit_memlock(CHILD_LIMIT);
        sys::drop_cap_ipc_lock();
        let pool = PinnedPool::new(PoolConfig::default().backend(BackendChoice::Mlock));
        let small = pool
            .alloc(64 << 10)
            .expect("64 KiB fits under a 1 MiB limit");
        let err = pool
            .alloc(4 << 20)
            .expect_err("4 MiB must not fit under a 1 MiB limit");
        let msg = err.to_string();
        assert!(
            matches!(&err, Error::MemlockLimit { requested, limit }
                if *requested == 4 << 20 && limit == &format!("{CHILD_LIMIT} bytes")),
            "{err:?}"
        );
        assert!(
            msg.contains("the locked-memory limit (`ulimit -l`) is 1048576 bytes"),
            "{msg}"
        );
        assert!(msg.contains("cannot page-lock 4194304 bytes"), "{msg}");
        drop(small);
        // The pool still works after the failure.
        drop(pool.alloc(16 << 10).expect("small blocks still fit"));
        println!("child: {msg}");
        println!("CHILD-OK");
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
        .expect("re-run the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("CHILD-OK"),
        "child failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked") && !stdout.contains("panicked"));
}
