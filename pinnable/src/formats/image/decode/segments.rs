//! What a JPEG's segments tell before it is decoded: whether it is whole (an end-of-image
//! marker after the first scan) and whether its scans can hold the blocks its frame declares.

/// Whether a JPEG of `width × height` (its frame header's) is whole by the checks the host
/// decoder makes before decoding: an end-of-image marker after the first scan, and enough scan
/// data for its blocks. The device decoders may not notice a file cut short; the device path
/// sends a file that fails these to the host decoder, which names it and the reason.
pub(crate) fn jpeg_looks_whole(bytes: &[u8], width: usize, height: usize) -> bool {
    let segments = segments(bytes);
    let plane = (width.div_ceil(8) as u64).saturating_mul(height.div_ceil(8) as u64);
    segments.whole
        && !segments.ends_in_headers
        && segments.scan_bytes.saturating_mul(8) >= segments.blocks.max(plane)
}

/// What the segments of a JPEG tell before it is decoded.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Segments {
    /// An end-of-image marker follows the start of the first scan. A file cut short (a
    /// transfer or a disk that stopped) lacks it; entropy-coded data never holds the marker's
    /// bytes, and a thumbnail's own marker comes before the first scan.
    pub(super) whole: bool,
    /// The first component's sampling factors are below another's in a four-component
    /// frame: a layout (CMYK with only its key plane at full resolution) zune-jpeg decodes
    /// wrongly, so it is refused rather than decoded into wrong colours.
    pub(super) key_plane_finer: bool,
    /// The bytes end inside the headers, before any scan.
    pub(super) ends_in_headers: bool,
    /// The 8 × 8 blocks the frame header declares, summed over its components, each
    /// component counted at its own resolution (`ceil(ceil(width × h / h_max) / 8)` ×
    /// `ceil(ceil(height × v / v_max) / 8)`, without the padding to whole MCUs).
    ///
    /// This is a floor on the bits of scan data a Huffman-coded JPEG (the only kind decoded:
    /// baseline, extended and progressive) needs: every Huffman code is at least one bit, and
    /// every block of every component is coded at least once with at least one code — its DC
    /// difference (in a sequential scan, followed by at least an end-of-block code; in a
    /// progressive file, in the first DC scan, which must come before any AC scan of the
    /// component). Refinement and AC scans can cover many blocks with one end-of-band run, so
    /// they add nothing to the floor.
    pub(super) blocks: u64,
    /// Bytes from the first scan header to the end of the file: at least the scan data.
    pub(super) scan_bytes: u64,
    /// The frame header has three components, not all at one resolution.
    pub(super) subsampled: bool,
    /// Where the frame header's segment starts (at its marker): of several before the first
    /// scan, the last (the decoder refuses a file with two).
    pub(super) frame: Option<usize>,
    /// The components the first scan header lists.
    pub(super) scan_components: u8,
}

pub(super) fn segments(bytes: &[u8]) -> Segments {
    let mut found = Segments::default();
    // The host decoder's walk of the headers, step for step: after the start-of-image marker,
    // a byte after 0xFF is a marker code (fill bytes, 0xFF or 0x00, between them are passed
    // over; a 0x00 fill leaves the next byte no marker); every marker but a scan's start or
    // the end of the image opens a segment of the length it gives, known to the decoder or
    // not (restart, reserved and unknown codes included); other bytes are passed over.
    let mut i = 2;
    let mut last = 0u8;
    let scan = loop {
        let Some(&byte) = bytes.get(i) else {
            found.ends_in_headers = true;
            return found;
        };
        i += 1;
        let mut marker = byte;
        if last == 0xFF && matches!(marker, 0xFF | 0x00) {
            while matches!(marker, 0xFF | 0x00) {
                last = marker;
                let Some(&byte) = bytes.get(i) else {
                    found.ends_in_headers = true;
                    return found;
                };
                i += 1;
                marker = byte;
            }
        }
        if last != 0xFF {
            last = marker;
            continue;
        }
        // The marker's 0xFF is at `at`, its code at `at + 1`, its segment's length after.
        let at = i - 2;
        match marker {
            0xDA => {
                found.scan_components = bytes.get(at + 4).copied().unwrap_or(0);
                break at;
            }
            0xD9 => return found,
            _ => {
                let Some(len) = bytes.get(i..i + 2) else {
                    found.ends_in_headers = true;
                    return found;
                };
                let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
                if len < 2 {
                    // The decoder refuses a segment shorter than its length field.
                    return found;
                }
                // The frame headers the decoder reads (baseline, extended, progressive; it
                // skips the other kinds' codes as unknown segments). Of several, the last is
                // counted (the decoder refuses a second).
                if matches!(marker, 0xC0..=0xC2) {
                    found.blocks = frame_blocks(bytes.get(at + 4..).unwrap_or(&[]));
                    found.frame = Some(at);
                    found.subsampled = bytes.get(at + 9) == Some(&3)
                        && bytes
                            .get(at + 10..at + 19)
                            .is_some_and(|c| c[1] != c[4] || c[1] != c[7]);
                }
                // A frame header: precision, height, width, components, then 3 bytes each.
                if matches!(marker, 0xC0..=0xC2)
                    && bytes.get(at + 9) == Some(&4)
                    && let Some(c) = bytes.get(at + 10..at + 22)
                {
                    let first = c[1];
                    found.key_plane_finer = c
                        .chunks(3)
                        .any(|p| p[1] >> 4 > first >> 4 || p[1] & 15 > first & 15);
                }
                i += len;
            }
        }
        last = marker;
    };
    found.whole = bytes[scan..].windows(2).rev().any(|w| w == [0xFF, 0xD9]);
    found.scan_bytes = (bytes.len() - scan) as u64;
    found
}

/// The 8 × 8 blocks a frame header (from its precision byte on) declares, summed over its
/// components at their own resolutions; 0 for a header cut short.
pub(super) fn frame_blocks(frame: &[u8]) -> u64 {
    let Some(&[_, h0, h1, w0, w1, n]) = frame.first_chunk::<6>() else {
        return 0;
    };
    let (height, width) = (
        u64::from(u16::from_be_bytes([h0, h1])),
        u64::from(u16::from_be_bytes([w0, w1])),
    );
    let Some(components) = frame.get(6..6 + 3 * usize::from(n)) else {
        return 0;
    };
    let factors: Vec<(u64, u64)> = components
        .chunks_exact(3)
        .map(|c| (u64::from(c[1] >> 4).max(1), u64::from(c[1] & 15).max(1)))
        .collect();
    let h_max = factors.iter().map(|f| f.0).max().unwrap_or(1);
    let v_max = factors.iter().map(|f| f.1).max().unwrap_or(1);
    factors
        .iter()
        .map(|&(h, v)| {
            let w = (width * h).div_ceil(h_max);
            let hh = (height * v).div_ceil(v_max);
            w.div_ceil(8) * hh.div_ceil(8)
        })
        .sum()
}
