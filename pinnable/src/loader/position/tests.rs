use super::*;
use crate::loader::sampler::SplitMix64;

/// Rounds of random input (fewer under Miri, which runs each far slower).
const ROUNDS: usize = if cfg!(miri) { 200 } else { 20_000 };

fn random(r: &mut SplitMix64) -> Position {
    let world = 1 + r.below(64);
    let plan = (r.below(2) == 0).then(|| r.next_u64());
    Position {
        epoch: r.next_u64() >> (1 + r.below(63)),
        batch: r.next_u64() >> (1 + r.below(63)),
        seed: (r.below(2) == 0).then(|| r.next_u64()),
        rank: r.below(world),
        world,
        samples: (r.below(2) == 0).then(|| r.next_u64() >> 1),
        batch_size: 1 + r.below(1 << 20),
        drop_last: r.below(2) == 0,
        plan,
        plan_2: plan.is_some() && r.below(2) == 0,
        ahead: r.below(4) == 0,
    }
}

#[test]
fn both_forms_round_trip() {
    let mut r = SplitMix64::for_test("both_forms_round_trip");
    for _ in 0..ROUNDS / 20 {
        let p = random(&mut r);
        assert_eq!(Position::from_bytes(&p.to_bytes()).unwrap(), p);
        assert_eq!(p.to_string().parse::<Position>().unwrap(), p, "{p}");
    }
}

#[test]
fn hostile_bytes_and_strings_are_errors_not_panics() {
    let mut r = SplitMix64::for_test("hostile_bytes_and_strings");
    let good = random(&mut r).to_bytes();
    for _ in 0..ROUNDS {
        let mut b = good.clone();
        match r.below(3) {
            0 => {
                let i = r.below(b.len() as u64) as usize;
                b[i] = r.next_u64() as u8;
            }
            1 => b.truncate(r.below(b.len() as u64) as usize),
            _ => b = (0..r.below(80)).map(|_| r.next_u64() as u8).collect(),
        }
        if let Ok(p) = Position::from_bytes(&b) {
            assert_eq!(p.to_bytes(), b);
        }
    }
    let text = random(&mut r).to_string();
    for _ in 0..ROUNDS {
        let mut s: Vec<char> = text.chars().collect();
        let i = r.below(s.len() as u64) as usize;
        match r.below(3) {
            0 => {
                s[i] = char::from(b" =/0123456789abcdefghijklmnopqrstuvwxyz"[r.below(39) as usize])
            }
            1 => {
                s.remove(i);
            }
            _ => s.truncate(i),
        }
        let s: String = s.into_iter().collect();
        let _ = s.parse::<Position>();
    }
    for bad in [
        "",
        "pinnable-position/2 epoch=0",
        "pinnable-position/1 epoch=0 batch=0 seed=none shard=1/1 samples=4 batch_size=1 drop_last=true",
        "pinnable-position/1 epoch=0 batch=0 seed=none shard=0/1 samples=4 batch_size=0 drop_last=true",
        "pinnable-position/1 epoch=0 epoch=0",
    ] {
        assert!(bad.parse::<Position>().is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn settings_that_differ_are_named() {
    let p = Position::new((3, 5), Some(9), (1, 4), Some(100), 8, false);
    assert!(p.check_settings(&p.at(0, 0)).is_ok());
    let cases: [(Position, &str); 6] = [
        (
            Position {
                samples: Some(101),
                ..p
            },
            "dataset length",
        ),
        (Position { samples: None, ..p }, "dataset length"),
        (
            Position {
                batch_size: 16,
                ..p
            },
            "batch size",
        ),
        (Position { world: 8, ..p }, "world size"),
        (Position { rank: 2, ..p }, "rank"),
        (Position { seed: None, ..p }, "seed"),
    ];
    for (current, setting) in cases {
        match p.check_settings(&current) {
            Err(Error::Resume { setting: s, .. }) => assert_eq!(s, setting),
            other => panic!("{setting}: {other:?}"),
        }
    }
}

#[test]
fn epochs_and_batches_past_the_limit_are_refused() {
    let p = Position::new((0, 0), Some(1), (0, 1), Some(10), 2, false);
    let at = |epoch, batch| p.at(epoch, batch);
    for ok in [at(Position::LIMIT, 0), at(0, Position::LIMIT)] {
        assert_eq!(Position::from_bytes(&ok.to_bytes()).unwrap(), ok);
        assert_eq!(ok.to_string().parse::<Position>().unwrap(), ok);
    }
    for bad in [
        at(Position::LIMIT + 1, 0),
        at(u64::MAX, 0),
        at(0, Position::LIMIT + 1),
        at(3, u64::MAX),
    ] {
        for e in [
            Position::from_bytes(&bad.to_bytes()).unwrap_err(),
            bad.to_string().parse::<Position>().unwrap_err(),
        ] {
            assert!(matches!(e, Error::Position { .. }), "{e}");
            assert!(e.to_string().contains("Position::LIMIT"), "{e}");
        }
    }
}

/// A plan setting that differs is named; in a format-2 position of a packing plan (or a mix
/// of planned sources) it is a version error that says how to go on, and the position it
/// offers carries this loader's fingerprint in format 3.
#[test]
fn plan_settings_that_differ_are_named_and_format_2_ones_say_what_to_do() {
    let mut r = SplitMix64::for_test("plan_settings_that_differ");
    let (saved, now) = (r.next_u64() >> 1, r.next_u64() >> 1);
    let p = Position::new((r.below(9), r.below(9)), None, (0, 1), Some(100), 1, false)
        .with_plan(Some(saved));
    assert_eq!(p.version(), VERSION_PLAN);
    let p2 = Position { plan_2: true, ..p };
    for name in ["shuffle buffer", PACKING_PLAN, MIX_OF_PLANS] {
        for q in [p, p2] {
            assert!(q.check_plan(Some((name, saved))).is_ok());
        }
    }
    for q in [p, p2] {
        match q.check_plan(Some(("shuffle buffer", now))) {
            Err(Error::Resume {
                setting,
                saved: s,
                current,
            }) => {
                assert_eq!(
                    (setting, s, current),
                    ("shuffle buffer", saved.to_string(), now.to_string())
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(q.check_plan(None), Err(Error::Resume { .. })));
    }
    for name in [PACKING_PLAN, MIX_OF_PLANS] {
        assert!(matches!(
            p.check_plan(Some((name, now))),
            Err(Error::Resume { .. })
        ));
        let e = p2.check_plan(Some((name, now))).unwrap_err();
        let Error::Position { problem } = &e else {
            panic!("{e:?}")
        };
        assert!(problem.contains("format version 2"), "{e}");
        assert!(problem.contains(&format!("set_epoch({})", p.epoch)), "{e}");
        let offered = problem.rsplit('`').nth(1).unwrap();
        let q: Position = offered.parse().unwrap();
        assert_eq!(q, p.with_plan(Some(now)), "{e}");
        assert_eq!(q.version(), VERSION_PLAN);
        assert!(q.check_plan(Some((name, now))).is_ok());
    }
}

/// Version 2 positions read back as version 2, byte for byte and word for word; unknown
/// versions are refused, a newer one saying so.
#[test]
fn format_2_round_trips_and_unknown_versions_are_refused() {
    let mut r = SplitMix64::for_test("format_2_round_trips");
    let p = Position {
        plan_2: true,
        ..Position::new((1, 2), Some(r.next_u64()), (0, 2), Some(50), 5, false)
            .with_plan(Some(r.next_u64()))
    };
    let bytes = p.to_bytes();
    assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), 2);
    assert_eq!(Position::from_bytes(&bytes).unwrap(), p);
    assert!(p.to_string().starts_with("pinnable-position/2 "));
    assert_eq!(p.to_string().parse::<Position>().unwrap(), p);
    for v in [0u16, 4, 9] {
        let mut b = bytes.clone();
        b[4..6].copy_from_slice(&v.to_le_bytes());
        let e = Position::from_bytes(&b).unwrap_err().to_string();
        assert!(e.contains(&format!("format version {v}")), "{e}");
        assert_eq!(e.contains("newer release"), v > 3, "{e}");
    }
}
