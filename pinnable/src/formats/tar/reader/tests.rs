//! The reader on archives written byte by byte: pax records, base-256 sizes, old
//! directories, and lengths past the end.

use super::*;

/// A header block for `name` of type `flag` claiming `size` bytes (octal, or base-256
/// when `base256`), checksummed.
fn header(name: &[u8], flag: u8, size: u64, base256: bool) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[..name.len()].copy_from_slice(name);
    if base256 {
        h[124] = 0x80;
        h[128..136].copy_from_slice(&size.to_be_bytes());
    } else {
        h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    }
    h[156] = flag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[148..156].copy_from_slice(b"        ");
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

fn data(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(bytes);
    out.resize(out.len().next_multiple_of(512), 0);
}

fn pax(records: &[(&str, &str)]) -> Vec<u8> {
    let mut text = String::new();
    for (k, v) in records {
        let body = format!(" {k}={v}\n");
        let mut n = body.len() + 1;
        while format!("{n}{body}").len() != n {
            n += 1;
        }
        text.push_str(&format!("{n}{body}"));
    }
    text.into_bytes()
}

#[test]
fn pax_size_and_path_base256_sizes_and_old_directories_are_read() {
    let mut r = crate::loader::SplitMix64::for_test("pax_size_and_path");
    let payload: Vec<u8> = (0..1 + r.below(2000)).map(|_| r.next_u64() as u8).collect();
    let mut tar = Vec::new();
    let g = pax(&[("comment", "global")]);
    tar.extend(header(b"pax_global", b'g', g.len() as u64, false));
    data(&mut tar, &g);
    let x = pax(&[
        ("path", "very/long/name.BIN"),
        ("size", &payload.len().to_string()),
    ]);
    tar.extend(header(b"PaxHeader", b'x', x.len() as u64, false));
    data(&mut tar, &x);
    let at = tar.len() as u64;
    tar.extend(header(b"short.bin", b'0', 0, false)); // size 0: pax says otherwise
    data(&mut tar, &payload);
    let big = tar.len() as u64;
    tar.extend(header(b"b256.txt", b'0', 3, true));
    data(&mut tar, b"abc");
    tar.extend(header(b"olddir/", 0, 0, false));
    tar.extend([0u8; 1024]);
    let got: Vec<Member> = members(&tar, "t.tar").map(|m| m.unwrap()).collect();
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].path, b"very/long/name.BIN");
    assert_eq!(got[0].header, 512 + 512); // the x header, after the global one
    assert_eq!((got[0].data, got[0].size), (at + 512, payload.len() as u64));
    assert_eq!(&tar[got[0].data as usize..][..payload.len()], &payload[..]);
    assert_eq!((got[1].data, got[1].size), (big + 512, 3));
    assert_eq!(got[2].kind, Kind::Directory);
}

#[test]
fn lengths_past_the_end_are_errors_naming_the_offset() {
    let mut tar = Vec::new();
    tar.extend(header(b"a.txt", b'0', 5, false));
    data(&mut tar, b"hello");
    let second = tar.len() as u64;
    tar.extend(header(b"b.txt", b'0', 1 << 40, true)); // a terabyte
    data(&mut tar, b"x");
    let got: Vec<_> = members(&tar, "t.tar").collect();
    assert_eq!(got.len(), 2);
    let Err(Error::Tar {
        offset, problem, ..
    }) = &got[1]
    else {
        panic!("{:?}", got[1])
    };
    assert_eq!(*offset, second);
    assert!(problem.contains("truncated"), "{problem}");
    // A pax header claiming more than the bound is refused before it is read.
    let mut tar = header(b"PaxHeader", b'x', MAX_META + 1, false);
    tar.resize(tar.len() + MAX_META as usize + 512, b'1');
    let got: Vec<_> = members(&tar, "t.tar").collect();
    assert!(
        matches!(&got[0], Err(Error::Tar { offset: 0, .. })),
        "{got:?}"
    );
}
