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
use crate::storage::{Session, Storage, is_url};
use crate::tensor::Tensor;

#[derive(Clone, Debug)]
struct Folder {
    files: Vec<PathBuf>,
    labels: Vec<i64>,
    classes: Vec<String>,
    /// How files at URLs are read (none: every file is local).
    storage: Option<Arc<Session>>,
}

impl Folder {
    /// The bytes of the file at `path` (a path or a URL), appended to `bytes`.
    fn read(&self, path: &Path, bytes: &mut Vec<u8>) -> Result<()> {
        let name = path.to_string_lossy();
        if is_url(&name) {
            let session = match &self.storage {
                Some(s) => s.clone(),
                None => Arc::new(Session::new(&Storage::new())),
            };
            let got = session.read_all(&name).map_err(|e| match e {
                Error::Storage { problem, .. } => Error::Image {
                    path: name.clone().into_owned(),
                    problem: format!("cannot read the file: {problem}"),
                },
                e => e,
            })?;
            bytes.extend_from_slice(&got);
            return Ok(());
        }
        fs::File::open(path)
            .and_then(|mut f| f.read_to_end(bytes))
            .map_err(|e| read_error(path, &e))?;
        Ok(())
    }
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
    /// `root` is a local folder or, with the `remote` feature, an `s3://bucket/prefix` URL,
    /// read with the default [`Storage`] settings ([`open_with`](Self::open_with)).
    ///
    /// # Errors
    ///
    /// [`Error::ImageFolder`] naming the folder: `root` cannot be listed, has no class
    /// folder, or a class folder holds no image.
    pub fn open(root: impl AsRef<Path>) -> Result<ImageFolder> {
        ImageFolder::open_with(&Storage::new(), root)
    }

    /// The images under `root` as [`open`](Self::open) lists them, read as `storage` says.
    /// An `s3://bucket/prefix` URL is listed through the bucket (every key under the prefix:
    /// `prefix/class/…/file.jpg`), in the order a local folder of the same files lists; a
    /// web server gives no listing, so an `http(s)://` folder is an error: name its files
    /// with their labels through [`from_list_with`](Self::from_list_with).
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open); for a URL, also the storage's errors (the `remote` feature
    /// off, the bucket missing or refused).
    pub fn open_with(storage: &Storage, root: impl AsRef<Path>) -> Result<ImageFolder> {
        let root = root.as_ref();
        let name = root.to_string_lossy();
        if is_url(&name) {
            return ImageFolder::open_url(storage, &name);
        }
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
    /// Paths and (feature `remote`) `s3://` and `http(s)://` URLs, the latter read with the
    /// default [`Storage`] settings.
    pub fn from_list<P: Into<PathBuf>>(items: impl IntoIterator<Item = (P, i64)>) -> ImageFolder {
        ImageFolder::from_list_with(&Storage::new(), items)
    }

    /// The images at these paths or URLs, with these labels, in this order, read as `storage`
    /// says. Nothing is read until a sample is.
    pub fn from_list_with<P: Into<PathBuf>>(
        storage: &Storage,
        items: impl IntoIterator<Item = (P, i64)>,
    ) -> ImageFolder {
        let (files, labels) = items.into_iter().map(|(p, l)| (p.into(), l)).unzip();
        let mut folder = ImageFolder::new(files, labels, Vec::new());
        Arc::make_mut(&mut folder.folder).storage = Some(Arc::new(Session::new(storage)));
        folder
    }

    /// The images under the bucket prefix `root`, as a local folder of the same files lists
    /// them: class folders by name, then within each folder its files by name before its
    /// subfolders.
    fn open_url(storage: &Storage, root: &str) -> Result<ImageFolder> {
        let session = Session::new(storage);
        let base = root.trim_end_matches('/');
        let err = |problem: String| Error::ImageFolder {
            path: root.to_owned(),
            problem,
        };
        let listed = session.list(root).map_err(|e| match e {
            Error::Storage { problem, .. } => err(problem),
            e => e,
        })?;
        // Each image's path below the root, as (is a folder, name) per component.
        let mut found: Vec<(Vec<(bool, String)>, String)> = listed
            .into_iter()
            .filter_map(|(url, _)| {
                let rel = url.strip_prefix(base)?.trim_start_matches('/').to_owned();
                let parts: Vec<&str> = rel.split('/').collect();
                (parts.len() >= 2 && is_image(Path::new(parts[parts.len() - 1]))).then(|| {
                    let last = parts.len() - 1;
                    let key = parts
                        .iter()
                        .enumerate()
                        .map(|(k, p)| (k < last, (*p).to_owned()))
                        .collect();
                    (key, url)
                })
            })
            .collect();
        found.sort();
        let (mut files, mut labels, mut classes) = (Vec::new(), Vec::new(), Vec::<String>::new());
        for (key, url) in found {
            let class = &key[0].1;
            if classes.last() != Some(class) {
                classes.push(class.clone());
            }
            files.push(PathBuf::from(url));
            labels.push(classes.len() as i64 - 1);
        }
        if classes.is_empty() {
            return Err(err(
                "no image under it in a class folder: put each class's images under \
                 prefix/class/"
                    .into(),
            ));
        }
        let mut folder = ImageFolder::new(files, labels, classes);
        Arc::make_mut(&mut folder.folder).storage = Some(Arc::new(session));
        Ok(folder)
    }

    fn new(files: Vec<PathBuf>, labels: Vec<i64>, classes: Vec<String>) -> ImageFolder {
        ImageFolder {
            folder: Arc::new(Folder {
                files,
                labels,
                classes,
                storage: None,
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
        self.folder.read(path, bytes)
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
        // Files at URLs are read through storage and copied into the block; local files are
        // read straight into it.
        if samples.iter().any(|s| is_url(&s.path().to_string_lossy())) {
            let read = samples
                .iter()
                .zip(&labels)
                .map(|(s, &label)| {
                    let bytes = s.bytes().map_err(|e| Error::Sample {
                        index: s.index(),
                        during: "loading",
                        source: Box::new(e),
                    })?;
                    Ok((bytes, s.path().to_path_buf(), s.index(), label))
                })
                .collect::<Result<Vec<_>>>()?;
            let pictures: Vec<_> = read
                .iter()
                .map(|(b, n, i, l)| (b.as_slice(), n.clone(), *i, *l))
                .collect();
            return Inputs::copied(&pictures, max_pixels, c);
        }
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
