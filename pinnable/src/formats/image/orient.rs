//! The EXIF orientation: read from a file's EXIF block (a TIFF structure) and applied to the
//! decoded pixels, so every image comes out upright, as PIL's `ImageOps.exif_transpose` makes it.

use super::decode::Image;

/// The orientation tag of the first image directory.
const ORIENTATION: u16 = 0x0112;

/// The orientation (1 to 8) an EXIF block (starting at its TIFF header) records, if any. Reads
/// only within `exif`: a malformed block gives `None`.
pub(crate) fn from_exif(exif: &[u8]) -> Option<u8> {
    let big = match exif.get(..4)? {
        [b'M', b'M', 0, 42] => true,
        [b'I', b'I', 42, 0] => false,
        _ => return None,
    };
    let u16_at = |at: usize| {
        let b = exif.get(at..at.checked_add(2)?)?;
        Some(if big {
            u16::from_be_bytes([b[0], b[1]])
        } else {
            u16::from_le_bytes([b[0], b[1]])
        })
    };
    let u32_at = |at: usize| {
        let b = exif.get(at..at.checked_add(4)?)?;
        Some(if big {
            u32::from_be_bytes([b[0], b[1], b[2], b[3]])
        } else {
            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
        })
    };
    let ifd = usize::try_from(u32_at(4)?).ok()?;
    let entries = u16_at(ifd)?;
    (0..usize::from(entries)).find_map(|k| {
        let entry = ifd.checked_add(2)?.checked_add(k.checked_mul(12)?)?;
        // Tag, then type 3 (SHORT) with a count of 1: the value sits in the entry.
        if u16_at(entry)? != ORIENTATION || u16_at(entry + 2)? != 3 || u32_at(entry + 4)? != 1 {
            return None;
        }
        let value = u16_at(entry + 8)?;
        (1..=8).contains(&value).then_some(value as u8)
    })
}

/// Turns `image`, stored with EXIF orientation `orientation`, upright; `spare` is scratch memory
/// kept for the next call. Orientation 1 (and any unknown value) leaves it as it is.
pub(crate) fn apply(orientation: u8, image: &mut Image, spare: &mut Vec<u8>) {
    if !(2..=8).contains(&orientation) {
        return;
    }
    let (w, h) = (image.width(), image.height());
    // Orientations 5 to 8 swap the axes.
    let (uw, uh) = if orientation >= 5 { (h, w) } else { (w, h) };
    spare.clear();
    spare.resize(w * h * 3, 0);
    let src = image.pixels();
    // Upright pixel (x, y) is stored pixel (sx, sy).
    for y in 0..uh {
        for x in 0..uw {
            let (sx, sy) = match orientation {
                2 => (w - 1 - x, y),
                3 => (w - 1 - x, h - 1 - y),
                4 => (x, h - 1 - y),
                5 => (y, x),
                6 => (y, h - 1 - x),
                7 => (w - 1 - y, h - 1 - x),
                _ => (w - 1 - y, x),
            };
            let (d, s) = ((y * uw + x) * 3, (sy * w + sx) * 3);
            spare[d..d + 3].copy_from_slice(&src[s..s + 3]);
        }
    }
    let mut upright = Image::from_rgb(uw, uh, std::mem::take(spare)).expect("same pixel count");
    std::mem::swap(image, &mut upright);
    *spare = upright.into_pixels();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A little-endian or big-endian TIFF block whose first directory holds `tags`.
    fn exif(big: bool, tags: &[(u16, u16, u32, u16)]) -> Vec<u8> {
        let w16 = |v: u16| {
            if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        };
        let w32 = |v: u32| {
            if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        };
        let mut b = if big {
            b"MM\0*".to_vec()
        } else {
            b"II*\0".to_vec()
        };
        b.extend(w32(8));
        b.extend(w16(tags.len() as u16));
        for &(tag, kind, count, value) in tags {
            b.extend(w16(tag));
            b.extend(w16(kind));
            b.extend(w32(count));
            b.extend(w16(value));
            b.extend([0, 0]);
        }
        b
    }

    #[test]
    fn the_orientation_tag_is_found_in_either_byte_order() {
        for big in [false, true] {
            for o in 1..=8 {
                let b = exif(big, &[(0x010F, 2, 4, 0), (ORIENTATION, 3, 1, o)]);
                assert_eq!(from_exif(&b), Some(o as u8));
            }
            assert_eq!(from_exif(&exif(big, &[(ORIENTATION, 3, 1, 9)])), None);
            assert_eq!(from_exif(&exif(big, &[(ORIENTATION, 4, 1, 6)])), None);
            let b = exif(big, &[(ORIENTATION, 3, 1, 6)]);
            for cut in 0..b.len() - 2 {
                assert_eq!(from_exif(&b[..cut]), None, "cut at {cut}");
            }
        }
    }

    #[test]
    fn each_orientation_turns_the_stored_pixels_upright() {
        // Stored 3 × 2:  a b c / d e f  (each pixel's channels hold its letter).
        let stored: Vec<u8> = b"abcdef".iter().flat_map(|&p| [p; 3]).collect();
        // What the EXIF specification displays for each orientation, row by row.
        let expected: [(usize, &[u8]); 8] = [
            (3, b"abcdef"),
            (3, b"cbafed"),
            (3, b"fedcba"),
            (3, b"defabc"),
            (2, b"adbecf"),
            (2, b"daebfc"),
            (2, b"fcebda"),
            (2, b"cfbead"),
        ];
        for (o, (width, rows)) in (1..=8u8).zip(expected) {
            let mut image = Image::from_rgb(3, 2, stored.clone()).unwrap();
            apply(o, &mut image, &mut Vec::new());
            let got: Vec<u8> = image.pixels().chunks(3).map(|p| p[0]).collect();
            assert_eq!(image.width(), width, "orientation {o}");
            assert_eq!(
                got,
                rows,
                "orientation {o}: {}",
                String::from_utf8_lossy(&got)
            );
        }
    }

    #[test]
    fn fuzzed_exif_blocks_give_an_orientation_or_none() {
        let mut seeds = Vec::new();
        for big in [false, true] {
            for o in [1, 3, 6, 8] {
                seeds.push(exif(big, &[(0x010F, 2, 4, 0), (ORIENTATION, 3, 1, o)]));
            }
            seeds.push(exif(big, &[(ORIENTATION, 3, 1, 6), (0x0110, 2, 4, 0)]));
        }
        crate::fuzz::Fuzz::new("exif_orientation")
            .seeds(seeds)
            .tokens(&[
                b"II*\0",
                b"MM\0*",
                b"\x01\x12",
                b"\x12\x01",
                b"\0\x03",
                b"\x03\0",
            ])
            .run(|bytes| {
                let Some(o) = from_exif(bytes) else {
                    return Ok(());
                };
                if !(1..=8).contains(&o) {
                    return Err(format!("orientation {o}"));
                }
                // Every read that found it lies inside the block: bytes after it change nothing.
                let mut longer = bytes.to_vec();
                longer.extend([0x01, 0x12, 0x00, 0x03, 0xFF, 0xFF, 0xFF, 0xFF]);
                match from_exif(&longer) {
                    Some(again) if again == o => Ok(()),
                    other => Err(format!("{o} became {other:?} with bytes appended")),
                }
            });
    }
}
