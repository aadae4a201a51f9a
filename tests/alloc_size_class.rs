//! Size classes: at most 1/8 waste over the page-rounded request, and a reused block is never
//! smaller than the request (PyTorch PR #192722).

use pinnable::{BackendChoice, PinnedPool, PoolConfig};
use rand::Rng;

#[test]
fn reserved_is_within_an_eighth_plus_a_page_for_1_byte_to_1_gib() {
    let mut rng = pinnable_harness::rng("size_classes_random");
    let page = pinnable::PinnedPool::rounded_size(1);
    assert!(page.is_power_of_two());
    for _ in 0..200_000 {
        let bits = rng.random_range(0..=30);
        let requested = rng.random_range(1..=1usize << bits);
        let reserved = pinnable::PinnedPool::rounded_size(requested);
        assert!(reserved >= requested, "{requested} -> {reserved}");
        assert_eq!(reserved % page, 0);
        assert!(
            reserved as u128 * 8 <= requested as u128 * 9 + page as u128 * 8,
            "{requested} -> {reserved}: more than 1/8 + a page"
        );
    }
    assert_eq!(pinnable::PinnedPool::rounded_size(1 << 30), 1 << 30);
}

#[test]
fn power_of_two_requests_and_their_neighbours_round_tightly() {
    let page = pinnable::PinnedPool::rounded_size(1);
    for p in 12..=30 {
        let r = 1usize << p;
        assert_eq!(
            pinnable::PinnedPool::rounded_size(r),
            r.div_ceil(page) * page
        );
        assert!(pinnable::PinnedPool::rounded_size(r + 1) <= r + r / 8 + page);
        assert!(pinnable::PinnedPool::rounded_size(r - 1) >= r - 1);
    }
}

#[test]
fn reused_large_block_is_never_smaller_than_the_request() {
    let mut rng = pinnable_harness::rng("size_classes_reuse");
    let _ = pinnable::PinnedPool::raise_memlock_limit();
    let pool = PinnedPool::new(PoolConfig::default().backend(BackendChoice::Mlock));
    let page = pinnable::PinnedPool::rounded_size(1);
    let large = 512 * page;
    let big = pool.alloc(large).expect("a 2 MiB page-locked block");
    let big_ptr = big.as_ptr();
    drop(big);
    let mut sizes = vec![
        1,
        page,
        large / 2,
        large - page,
        large - 1,
        large,
        large + 1,
        2 * large,
    ];
    sizes.extend((0..40).map(|_| rng.random_range(1..=2 * large)));
    for bytes in sizes {
        let b = pool.alloc(bytes).unwrap();
        assert!(b.capacity() >= bytes && b.len() == bytes, "{bytes}: {b:?}");
        if b.as_ptr() == big_ptr {
            assert_eq!(
                b.capacity(),
                pinnable::PinnedPool::rounded_size(large),
                "the large block served {bytes}"
            );
        }
        // Every requested byte is writable (a smaller block would fault or corrupt others).
        // SAFETY: the block is ours alone.
        unsafe { b.as_mut_slice() }.fill(0x5A);
        // SAFETY: as above.
        assert!(unsafe { b.as_slice() }.iter().all(|&x| x == 0x5A));
    }
    let s = pool.stats();
    assert!(
        s.hits >= 1,
        "the large block was reused for a request of its class\n{s}"
    );
}
