use super::*;
use crate::image::ImageFolder;
use crate::loader::{Dataset, SplitMix64};

/// PNGs of random sizes written under a folder of the test's own; their pixels.
fn pngs(seed: u64, n: usize) -> (std::path::PathBuf, Vec<(usize, usize, Vec<u8>)>) {
    let mut rng = SplitMix64::new(seed);
    let dir = std::env::temp_dir().join(format!("pinnable-ragged-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let images = (0..n)
        .map(|i| {
            let (w, h) = (1 + rng.below(80) as usize, 1 + rng.below(80) as usize);
            let px: Vec<u8> = (0..w * h * 3).map(|_| rng.next_u64() as u8).collect();
            let mut file = Vec::new();
            let mut e = png::Encoder::new(&mut file, w as u32, h as u32);
            e.set_color(png::ColorType::Rgb);
            e.write_header().unwrap().write_image_data(&px).unwrap();
            std::fs::write(dir.join(format!("{i:02}.png")), file).unwrap();
            (w, h, px)
        })
        .collect();
    (dir, images)
}

#[test]
fn the_table_places_every_image_and_draws_the_cpu_path_s_crops() {
    let (dir, images) = pngs(7, 23);
    let list = (0..images.len()).map(|i| (dir.join(format!("{i:02}.png")), i as i64));
    for t in [
        Transform::random_resized_crop(17).flip(0.5),
        Transform::resized_center_crop(40, 30).flip(1.0),
        Transform::center_crop(50),
    ] {
        let folder = ImageFolder::from_list(list.clone()).transform(t.clone());
        let samples: Vec<_> = (0..folder.len()).map(|i| folder.get(i).unwrap()).collect();
        let mut c = Collator::new(PinnedPool::global());
        let (batch, labels) = DecodedBatcher.batch(samples, &mut c).unwrap();
        assert_eq!(
            labels.to_vec::<i64>().unwrap(),
            (0..23).collect::<Vec<i64>>()
        );
        let pixels = batch.pixels().unwrap().to_vec::<u8>().unwrap();
        let entries = batch.entries();
        assert_eq!(entries.len(), images.len());
        let mut offset = 0;
        for (pos, (e, (w, h, px))) in entries.iter().zip(&images).enumerate() {
            assert_eq!(
                (e.offset, e.width, e.height),
                (offset, *w, *h),
                "image {pos}"
            );
            assert_eq!(&pixels[offset..offset + w * h * 3], &px[..], "image {pos}");
            let plan = t.plan(
                *w,
                *h,
                &mut Collator::new(PinnedPool::global()).sample_rng(pos),
            );
            assert_eq!(e.plan, plan, "image {pos}");
            assert_eq!(batch.decoded_size(pos), Some((*w, *h)));
            offset += w * h * 3;
        }
        assert_eq!(offset, pixels.len());
        // On the host: each image is the CPU path's.
        let out = batch.tensor().unwrap();
        let size = t.shape()[1];
        assert_eq!(batch.shape(), [23, 3, size, size]);
        let out = out.to_vec::<u8>().unwrap();
        for (pos, (w, h, px)) in images.iter().enumerate() {
            let image = crate::image::Image::from_rgb(*w, *h, px.clone()).unwrap();
            let rng = Collator::new(PinnedPool::global()).sample_rng(pos);
            let want = t.apply(&image, rng).unwrap().to_vec::<u8>().unwrap();
            assert_eq!(
                &out[pos * want.len()..][..want.len()],
                &want[..],
                "image {pos}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn entries_read_back_as_written() {
    let mut rng = SplitMix64::new(11);
    for _ in 0..200 {
        let mut r = |n: u64| rng.below(n) as usize;
        let e = Entry {
            offset: r(1 << 40),
            width: r(1 << 20),
            height: r(1 << 20),
            plan: Plan {
                crop: Rect {
                    x: r(1000),
                    y: r(1000),
                    w: r(1000),
                    h: r(1000),
                },
                resized: (r(1000), r(1000)),
                at: (r(2000) as isize - 1000, r(2000) as isize - 1000),
                flip: r(2) == 1,
            },
        };
        let mut b = [0u8; RESAMPLE_ENTRY_BYTES];
        e.encode(&mut b).unwrap();
        assert_eq!(Entry::decode(&b), e);
    }
}
