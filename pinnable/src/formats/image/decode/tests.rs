use super::*;

#[test]
fn a_jpeg_is_whole_only_with_its_end_marker_after_the_first_scan() {
    // SOI, an APP1 holding an end marker (a thumbnail's), SOS, data, EOI.
    let mut f = vec![0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x06, 0xFF, 0xD9, 0x00, 0x00];
    f.extend([0xFF, 0xDA, 0x00, 0x02, 0x12, 0x34, 0xFF, 0x00, 0x56]);
    assert!(!segments(&f).whole, "the thumbnail's marker does not count");
    f.extend([0xFF, 0xD9]);
    assert!(segments(&f).whole);
    f.extend([0x00; 7]);
    assert!(
        segments(&f).whole,
        "trailing bytes after the end marker are fine"
    );
    for cut in 0..f.len() - 9 {
        assert!(!segments(&f[..cut]).whole, "cut at {cut}");
    }
}

#[test]
fn a_four_plane_frame_with_a_finer_later_plane_is_noticed() {
    // SOI, SOF0 (8 bits, 8 × 8, 4 components: id, sampling, table), SOS, EOI.
    let frame = |sampling: [u8; 4]| {
        let mut f = vec![0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x14, 8, 0, 8, 0, 8, 4];
        for (id, s) in sampling.iter().enumerate() {
            f.extend([id as u8, *s, 0]);
        }
        f.extend([0xFF, 0xDA, 0x00, 0x02, 0xFF, 0xD9]);
        f
    };
    assert!(segments(&frame([0x11, 0x11, 0x11, 0x22])).key_plane_finer);
    assert!(!segments(&frame([0x11; 4])).key_plane_finer);
    assert!(!segments(&frame([0x22, 0x11, 0x11, 0x22])).key_plane_finer);
    assert!(segments(&frame([0x22, 0x11, 0x11, 0x22])).whole);
}

#[test]
fn markers_the_decoder_skips_by_length_hide_what_they_hold() {
    // SOI, SOF0 (17 × 9, one plane), then a reserved marker (0xFF43) whose segment holds a
    // second frame header (11 × 7): the decoder skips the reserved segment by its length, so
    // the frame it reads (and the walk counts) is the first. Found by the fuzz test below.
    let mut f = vec![
        0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x0B, 8, 0, 9, 0, 17, 1, 1, 0x11, 0,
    ];
    f.extend([
        0xFF, 0x43, 0x00, 0x0D, 0xFF, 0xC2, 0x00, 0x0B, 8, 0, 7, 0, 11, 1, 1,
    ]);
    f.extend([0xFF, 0xDA, 0x00, 0x08, 1, 1, 0, 0, 63, 0, 0x12, 0xFF, 0xD9]);
    let s = segments(&f);
    assert_eq!(s.frame, Some(2));
    assert_eq!(s.blocks, 3 * 2, "17 × 9 is 3 × 2 blocks");
    // A frame header of a kind the decoder does not read (0xC5, differential) is skipped too.
    let mut k = f.clone();
    k[16] = 0xC5;
    assert_eq!((segments(&k).frame, segments(&k).blocks), (Some(2), 6));
    // Fill bytes before a code are passed over; a 0x00 fill leaves the next byte no marker.
    let mut g = f.clone();
    g.splice(2..2, [0xFF, 0xFF]);
    assert_eq!(segments(&g).frame, Some(4));
    // Without the reserved marker, the second header is read, and 0xFF 0x00 0xC2 before it
    // is none.
    let mut h = f.clone();
    h.splice(15..17, [0xFF, 0x00, 0xC2]);
    assert_eq!(
        segments(&h).frame,
        Some(20),
        "the header at 20, not 0xFF 0x00 0xC2 at 15"
    );
    assert_eq!(segments(&h).blocks, 2, "11 × 7 is 2 × 1 blocks");
}

#[test]
fn debug_shows_the_size_not_the_pixels() {
    let mut rng = crate::loader::SplitMix64::for_test("debug_shows_the_size");
    let (w, h) = (1 + rng.below(300) as usize, 1 + rng.below(300) as usize);
    let pixels: Vec<u8> = (0..w * h * 3).map(|_| rng.next_u64() as u8).collect();
    let image = Image::from_rgb(w, h, pixels).unwrap();
    let text = format!("{image:?}");
    assert_eq!(
        text,
        format!("Image {{ width: {w}, height: {h}, bytes: {} }}", w * h * 3)
    );
    let decoder = format!("{:?}", Decoder::new().max_pixels(w));
    assert!(decoder.len() < 200, "{decoder}");
}

#[test]
fn a_frame_s_blocks_count_each_component_at_its_own_resolution() {
    // SOF: precision, height, width, components (id, sampling, table).
    let frame = |w: u16, h: u16, sampling: &[u8]| {
        let mut f = vec![8];
        f.extend(h.to_be_bytes());
        f.extend(w.to_be_bytes());
        f.push(sampling.len() as u8);
        for (id, &s) in sampling.iter().enumerate() {
            f.extend([id as u8, s, 0]);
        }
        f
    };
    let mut rng = crate::loader::SplitMix64::for_test("a_frame_s_blocks");
    for _ in 0..200 {
        let (w, h) = (1 + rng.below(65535), 1 + rng.below(65535));
        let b = |n: u64| n.div_ceil(8);
        let luma = b(w) * b(h);
        let f = frame(w as u16, h as u16, &[0x22, 0x11, 0x11]);
        assert_eq!(
            frame_blocks(&f),
            luma + 2 * b(w.div_ceil(2)) * b(h.div_ceil(2))
        );
        let f = frame(w as u16, h as u16, &[0x21, 0x11, 0x11]);
        assert_eq!(frame_blocks(&f), luma + 2 * b(w.div_ceil(2)) * b(h));
        assert_eq!(frame_blocks(&frame(w as u16, h as u16, &[0x11])), luma);
        let f = frame(w as u16, h as u16, &[0x11; 3]);
        for cut in 0..f.len() {
            assert_eq!(frame_blocks(&f[..cut]), 0, "cut at {cut}");
        }
    }
}

#[test]
fn a_png_s_image_data_is_summed_over_its_idat_chunks() {
    let chunk = |kind: &[u8], len: usize| {
        let mut c = (len as u32).to_be_bytes().to_vec();
        c.extend(kind);
        c.extend(std::iter::repeat_n(7, len));
        c.extend([0; 4]);
        c
    };
    let mut f = b"\x89PNG\r\n\x1a\n".to_vec();
    f.extend(chunk(b"IHDR", 13));
    f.extend(chunk(b"IDAT", 100));
    f.extend(chunk(b"tEXt", 40));
    f.extend(chunk(b"IDAT", 23));
    let whole = f.len();
    f.extend(chunk(b"IEND", 0));
    f.extend(chunk(b"IDAT", 1000));
    assert_eq!(
        png_image_data_bytes(&f),
        123,
        "nothing after the end chunk counts"
    );
    assert_eq!(
        png_image_data_bytes(&f[..whole - 4 - 10]),
        113,
        "a cut chunk counts its part"
    );
}

#[test]
fn unknown_and_empty_files_are_refused_with_the_path() {
    let mut d = Decoder::new();
    for (bytes, words) in [
        (&b""[..], "empty"),
        (b"BM\x00\x00", "neither a JPEG nor a PNG"),
        (b"\xFF\xD8\xFF", "truncated JPEG"),
        (b"\x89PNG\r\n\x1a\n\x00", "corrupt PNG"),
    ] {
        let e = d.decode(bytes, Path::new("dir/x.img")).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("dir/x.img") && text.contains(words), "{text}");
    }
}

/// The seed files (`tests/data/seeds`, written by `tests/data/make_seeds.py` with Pillow).
fn seed_files() -> Vec<(&'static str, Vec<u8>)> {
    macro_rules! seed {
        ($name:literal) => {
            (
                $name,
                include_bytes!(concat!("../../../../tests/data/seeds/", $name)).to_vec(),
            )
        };
    }
    vec![
        seed!("baseline-420-exif.jpg"),
        seed!("baseline-420-large.jpg"),
        seed!("progressive-420.jpg"),
        seed!("baseline-444.jpg"),
        seed!("gray.jpg"),
        seed!("cmyk.jpg"),
        seed!("restart-422.jpg"),
        seed!("rgb.png"),
        seed!("rgba-exif.png"),
        seed!("palette.png"),
        seed!("gray16.png"),
        seed!("interlaced.png"),
        seed!("gray-alpha.png"),
        // Chroma at most two samples wide, decoded under a rewritten frame header.
        (
            "4x37-420.jpg",
            include_bytes!("../../../../tests/data/small420/4x37-420.jpg").to_vec(),
        ),
        (
            "3x21-422p.jpg",
            include_bytes!("../../../../tests/data/small420/3x21-422p.jpg").to_vec(),
        ),
    ]
}

pub(crate) const JPEG_TOKENS: &[&[u8]] = &[
    b"\xFF\xC0\x00\x11\x08",
    b"\xFF\xC2",
    b"\xFF\xC4",
    b"\xFF\xDA\x00\x0C\x03",
    b"\xFF\xDB",
    b"\xFF\xDD\x00\x04\x00\x01",
    b"\xFF\xD0",
    b"\xFF\xD9",
    b"\xFF\xE1",
    b"Exif\x00\x00",
    b"\xFF\x00",
    b"\xFF\xFF",
];

#[test]
fn fuzzed_jpeg_segments_are_read_within_the_bytes() {
    let jpegs = seed_files()
        .into_iter()
        .filter(|(n, _)| n.ends_with(".jpg"))
        .map(|(_, b)| b);
    crate::fuzz::Fuzz::new("jpeg_segments")
        .seeds(jpegs)
        .tokens(JPEG_TOKENS)
        .run(|bytes| {
            let s = segments(bytes);
            if s.whole && s.ends_in_headers {
                return Err(format!("whole and ending in the headers: {s:?}"));
            }
            if s.whole && !bytes.windows(2).any(|w| w == [0xFF, 0xD9]) {
                return Err("whole without an end-of-image marker".into());
            }
            if s.scan_bytes > bytes.len() as u64 || s.blocks > 255 * 8192 * 8192 {
                return Err(format!("{s:?} of {} bytes", bytes.len()));
            }
            // A frame the walk counted is the one the decoder reads: it has at least the
            // blocks of one full-resolution plane of the size the decoder sees. (A walk
            // that met a scan before any frame header counts none; the decoder then floors
            // the count at that plane itself.)
            let mut d = JpegDecoder::new(ZCursor::new(bytes));
            if s.blocks > 0
                && d.decode_headers().is_ok()
                && let Some((w, h)) = d.dimensions()
                && s.blocks < (w.div_ceil(8) * h.div_ceil(8)) as u64
            {
                return Err(format!("{} blocks counted for a {w} × {h} frame", s.blocks));
            }
            Ok(())
        });
}

#[test]
fn fuzzed_files_decode_to_whole_images_or_errors_within_their_bytes() {
    let mut tokens = JPEG_TOKENS.to_vec();
    tokens.extend([
        &b"IHDR"[..],
        b"IDAT",
        b"IEND",
        b"PLTE",
        b"tRNS",
        b"eXIf",
        b"acTL",
    ]);
    let decoder = std::sync::Mutex::new(Decoder::new().max_pixels(1 << 22));
    crate::fuzz::Fuzz::new("image_decode")
        .seeds(seed_files().into_iter().map(|(_, b)| b))
        .tokens(&tokens)
        .run(move |bytes| {
            let mut decoder = decoder.lock().unwrap_or_else(|e| e.into_inner());
            let image = match decoder.decode(bytes, Path::new("dir/fuzz.img")) {
                Err(e) if e.to_string().contains("dir/fuzz.img") => return Ok(()),
                Err(e) => return Err(format!("an error that does not name the file: {e}")),
                Ok(image) => image,
            };
            let (w, h) = (image.width(), image.height());
            if image.pixels().len() != w * h * 3 || w * h == 0 || w * h > 1 << 22 {
                return Err(format!("{w} × {h} in {} bytes", image.pixels().len()));
            }
            // Memory follows the file's size: a JPEG's blocks take a bit each, a PNG's
            // bytes inflate 1032-fold at most (a pixel is at least one bit).
            let most = if bytes.starts_with(&[0xFF, 0xD8]) {
                64 * 8 * bytes.len()
            } else {
                8 * 1032 * bytes.len()
            };
            if w * h > most {
                return Err(format!("{w} × {h} pixels from {} bytes", bytes.len()));
            }
            Ok(())
        });
}
