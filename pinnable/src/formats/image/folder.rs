//! [`ImageFolder`]: a dataset of image files with labels; its samples ([`ImageFile`]) hand
//! their bytes to [`ImageBatcher`], whose [`ImageCodec`] writes each into its row of the batch.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::codec::{Encoded, ImageCodec};
use super::decode::EXTENSIONS;
use super::gpu::inputs::{Inputs, read_files};
use crate::error::{Error, Result};
use crate::loader::{Batcher, Collator, Dataset};
use crate::tensor::Tensor;

#[derive(Clone, Debug)]
struct Folder {
    files: Vec<PathBuf>,
    labels: Vec<i64>,
    classes: Vec<String>,
}

/// Image files and their labels, as a [`Dataset`]: like torchvision's `ImageFolder` (one
/// subfolder per class, classes and files sorted) or a list of `(path, label)`.
///
/// Each sample is an [`ImageFile`], a cheap handle: `get` reads nothing. The bytes are read
/// when the batch is written, by [`ImageBatcher`], and decoded and transformed by its
/// [`ImageCodec`] (the same settings and the same rows as for a tar shard's members), each
/// image straight into its row of the batch's pinned block, or on the GPU's decoders when the
/// loader's device is a GPU.
///
/// # Examples
///
/// ```no_run
/// use pinnable::formats::image::{ImageBatcher, ImageCodec, ImageFolder, Transform};
/// use pinnable::loader::Loader;
///
/// // train/cat/001.jpg, train/cat/002.png, train/dog/001.jpg, ...
/// let train = ImageFolder::open("train")?;
/// println!("{} images of {} classes", train.len(), train.classes().len());
/// let codec = ImageCodec::new(Transform::random_resized_crop(224).flip(0.5));
/// let loader =
///     Loader::builder(train).batch_size(64).shuffle(7).workers(8).build(ImageBatcher::new(codec))?;
/// for batch in &loader {
///     let (images, labels) = batch?; // u8 [64, 3, 224, 224] and i64 [64], in one pinned block
/// }
/// # Ok::<(), pinnable::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct ImageFolder {
    folder: Arc<Folder>,
}

fn folder_error(path: &Path, problem: String) -> Error {
    Error::ImageFolder {
        path: path.display().to_string(),
        problem,
    }
}

/// The entries of `dir`, sorted by name (byte order, as Python sorts names).
fn sorted_entries(dir: &Path) -> Result<Vec<fs::DirEntry>> {
    let read = fs::read_dir(dir).map_err(|e| folder_error(dir, format!("cannot list it: {e}")))?;
    let mut entries = read
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| folder_error(dir, format!("cannot list it: {e}")))?;
    entries.sort_by_key(|e| e.file_name());
    Ok(entries)
}

fn is_image(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
}

/// Every image under `dir`, following links, in the order torchvision lists them: folders by
/// their path, files by name within each.
fn images_under(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) -> Result<()> {
    if depth > 64 {
        return Err(folder_error(
            dir,
            "folders nest over 64 deep (a link loop?)".into(),
        ));
    }
    let mut subdirs = Vec::new();
    for entry in sorted_entries(dir)? {
        let path = entry.path();
        // `metadata` follows links, as torchvision's walk does.
        match fs::metadata(&path) {
            Ok(m) if m.is_dir() => subdirs.push(path),
            Ok(m) if m.is_file() && is_image(&path) => out.push(path),
            _ => {}
        }
    }
    for sub in subdirs {
        images_under(&sub, out, depth + 1)?;
    }
    Ok(())
}

impl ImageFolder {
    /// The images under `root`, one subfolder per class: classes are the subfolders' names,
    /// sorted, labelled `0..`; each class's files (`.jpg`, `.jpeg`, `.png`, any case, in
    /// nested folders too) sorted as torchvision's `ImageFolder` sorts them. Other files are
    /// not listed.
    ///
    /// # Errors
    ///
    /// [`Error::ImageFolder`] naming the folder: `root` cannot be listed, has no class
    /// folder, or a class folder holds no image.
    pub fn open(root: impl AsRef<Path>) -> Result<ImageFolder> {
        let root = root.as_ref();
        let mut classes = Vec::new();
        let (mut files, mut labels) = (Vec::new(), Vec::new());
        for entry in sorted_entries(root)? {
            let path = entry.path();
            if !fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
                continue;
            }
            let before = files.len();
            images_under(&path, &mut files, 0)?;
            if files.len() == before {
                return Err(folder_error(
                    &path,
                    "this class folder holds no .jpg, .jpeg or .png file; add images or remove \
                     the folder"
                        .into(),
                ));
            }
            labels.resize(files.len(), classes.len() as i64);
            classes.push(entry.file_name().to_string_lossy().into_owned());
        }
        if classes.is_empty() {
            return Err(folder_error(
                root,
                "it has no class folder: put each class's images in a subfolder named for it"
                    .into(),
            ));
        }
        Ok(ImageFolder::new(files, labels, classes))
    }

    /// The images at these paths, with these labels, in this order. Nothing is read until a
    /// sample is.
    pub fn from_list<P: Into<PathBuf>>(items: impl IntoIterator<Item = (P, i64)>) -> ImageFolder {
        let (files, labels) = items.into_iter().map(|(p, l)| (p.into(), l)).unzip();
        ImageFolder::new(files, labels, Vec::new())
    }

    fn new(files: Vec<PathBuf>, labels: Vec<i64>, classes: Vec<String>) -> ImageFolder {
        ImageFolder {
            folder: Arc::new(Folder {
                files,
                labels,
                classes,
            }),
        }
    }

    /// How many images.
    pub fn len(&self) -> usize {
        self.folder.files.len()
    }

    /// Whether there is no image (only for an empty [`from_list`](Self::from_list)).
    pub fn is_empty(&self) -> bool {
        self.folder.files.is_empty()
    }

    /// The class names, label `i` being `classes()[i]` (empty for [`from_list`](Self::from_list)).
    pub fn classes(&self) -> &[String] {
        &self.folder.classes
    }

    /// The file of sample `index`.
    pub fn path(&self, index: usize) -> Option<&Path> {
        self.folder
            .files
            .as_slice()
            .get(index)
            .map(PathBuf::as_path)
    }

    /// The label of sample `index`.
    pub fn label(&self, index: usize) -> Option<i64> {
        self.folder.labels.as_slice().get(index).copied()
    }
}

pub(super) fn read_error(path: &Path, e: &std::io::Error) -> Error {
    Error::Image {
        path: path.display().to_string(),
        problem: format!("cannot read the file: {e}"),
    }
}

impl Dataset for ImageFolder {
    type Sample = ImageFile;

    fn len(&self) -> usize {
        self.folder.files.len()
    }

    /// A handle on sample `index`; nothing is read yet.
    fn get(&self, index: usize) -> Result<ImageFile> {
        if index >= self.len() {
            return Err(Error::IndexOutOfRange {
                index,
                len: self.len(),
            });
        }
        Ok(ImageFile {
            folder: self.folder.clone(),
            index,
        })
    }
}

/// One sample of an [`ImageFolder`]: which file and its label.
#[derive(Clone, Debug)]
pub struct ImageFile {
    folder: Arc<Folder>,
    index: usize,
}

impl ImageFile {
    /// The sample's index in its dataset.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.folder.files[self.index]
    }

    /// The label.
    pub fn label(&self) -> i64 {
        self.folder.labels[self.index]
    }

    /// The file's bytes, read now.
    ///
    /// # Errors
    ///
    /// [`Error::Image`] naming the file that cannot be read.
    pub fn bytes(&self) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        self.read_into(&mut bytes)?;
        Ok(bytes)
    }

    /// Reads the file into `bytes` (cleared first, its capacity reused).
    fn read_into(&self, bytes: &mut Vec<u8>) -> Result<()> {
        let path = self.path();
        bytes.clear();
        fs::File::open(path)
            .and_then(|mut f| f.read_to_end(bytes))
            .map_err(|e| read_error(path, &e))?;
        Ok(())
    }
}

impl Encoded for ImageFile {
    fn with_bytes<R>(
        &self,
        buf: &mut Vec<u8>,
        f: impl FnOnce(&[u8], &Path) -> Result<R>,
    ) -> Result<R> {
        self.read_into(buf)?;
        f(buf, self.path())
    }

    fn gather(
        samples: &[ImageFile],
        labels: Vec<i64>,
        max_pixels: usize,
        c: &Collator,
    ) -> Result<Inputs> {
        let (block, ranges) = read_files(samples, c)?;
        Ok(Inputs {
            block,
            ranges,
            names: samples.iter().map(|s| s.path().to_path_buf()).collect(),
            indices: samples.iter().map(ImageFile::index).collect(),
            labels,
            max_pixels,
        })
    }
}

/// Batches [`ImageFile`]s into `(images, labels)`: the images `[B, 3, H, W]` (the codec's
/// transform's size and dtype), the labels `i64 [B]`. Each image draws its crop and flip from
/// its own random stream ([`Collator::sample_rng`]): the loader's seed, the epoch and the
/// sample's index.
///
/// Where the images are made is the [`ImageCodec`]'s [`DecodeOn`](super::DecodeOn) and the
/// loader's device ([`Collator::device`]): by default, on the GPU's JPEG decoders when the
/// loader delivers to a CUDA device and nvJPEG is there (each file's bytes read once into
/// pinned memory, the images made into the batch's device tensor, the labels pinned on the
/// host and moved by the loader); else decoded by the loader's workers straight into their
/// rows of the batch's pinned block ([`Collator::write_rows`]). The device is never named
/// here: one batcher serves every loader of
/// [`build_per_device`](crate::loader::LoaderBuilder::build_per_device), each GPU's decoding
/// state made on its first batch and kept.
///
/// # Errors
///
/// A file that cannot be read or decoded arrives as [`Error::Sample`] naming the sample's
/// index, its source an [`Error::Image`] naming the file and the reason.
#[derive(Clone, Debug, Default)]
pub struct ImageBatcher {
    codec: ImageCodec,
}

impl ImageBatcher {
    /// Images made as `codec` says.
    pub fn new(codec: ImageCodec) -> ImageBatcher {
        ImageBatcher { codec }
    }

    /// The codec's settings.
    pub fn codec(&self) -> &ImageCodec {
        &self.codec
    }
}

impl Batcher<ImageFile> for ImageBatcher {
    type Batch = (Tensor, Tensor);

    fn batch(&self, samples: Vec<ImageFile>, c: &mut Collator) -> Result<(Tensor, Tensor)> {
        let labels = samples.iter().map(ImageFile::label).collect();
        self.codec.batch(samples, labels, c)
    }
}
