//! Where nvJPEG is looked for: only in places the user names or the system's administrator
//! owns, never in folders any user can write to (a library found there would run its code in
//! the training process).
//!
//! In order:
//! 1. `PINNABLE_NVJPEG`, a path to the library: when set, the only place tried.
//! 2. `libnvjpeg.so.13`, then `.12`, by the system loader (`LD_LIBRARY_PATH`, the ld.so cache
//!    `ldconfig` keeps, `/lib` and `/usr/lib`).
//! 3. CUDA toolkits: `$CUDA_HOME`, `$CUDA_PATH` and `$CUDA_ROOT` (`lib64`, `lib` and
//!    `targets/<arch>-linux/lib`), then `/usr/local/cuda*` (newest first).
//! 4. Only when `PINNABLE_NVJPEG_FROM_PYTHON` asks for it: the NVIDIA wheels of one Python
//!    environment (`nvidia/cu13/lib` of `nvidia-nvjpeg`, `nvidia/nvjpeg/lib` of
//!    `nvidia-nvjpeg-cu12`, then torchvision's own copy in `torchvision.libs`) under its
//!    `lib/python3*/site-packages` (or `dist-packages`). `PINNABLE_NVJPEG_FROM_PYTHON=1` takes
//!    the active environment (`$VIRTUAL_ENV`, else `$CONDA_PREFIX`); a path (`sys.prefix`, e.g.
//!    `/opt/venv`) names one.
//!
//! `~/.local`, `/opt/*`, and other environments than the one named are never searched.
//! [`search`] is a pure function of the variables and the files under a root folder, so the
//! list is tested against a made-up tree.

use std::path::{Path, PathBuf};

/// The file names tried, newest first.
pub(crate) const NAMES: [&str; 2] = ["libnvjpeg.so.13", "libnvjpeg.so.12"];

/// The variable naming the library.
const EXPLICIT: &str = "PINNABLE_NVJPEG";
/// The variable that opts in to a Python environment's wheels.
const FROM_PYTHON: &str = "PINNABLE_NVJPEG_FROM_PYTHON";

/// Where the library is looked for (see the module's docs).
#[derive(Debug)]
pub(crate) struct Search {
    /// `PINNABLE_NVJPEG`: when set, the only place (the other fields are empty).
    pub(crate) explicit: Option<PathBuf>,
    /// The toolkits' folders, in order.
    pub(crate) toolkits: Vec<PathBuf>,
    /// The Python environment's site folders searched, when opted in.
    pub(crate) sites: Vec<PathBuf>,
    /// What was made of `PINNABLE_NVJPEG_FROM_PYTHON`, for the error.
    pub(crate) python: String,
    /// The files tried after the system loader's search, in order: each toolkit folder's
    /// [`NAMES`], then each site's wheels.
    pub(crate) files: Vec<PathBuf>,
}

/// Where the library is looked for, given the variables (`env`) and the file system under
/// `root` (`/` but in tests): toolkit folders found by listing are under `root`; paths the
/// variables name are taken as they are.
pub(crate) fn search(env: &dyn Fn(&str) -> Option<String>, root: &Path) -> Search {
    let var = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(path) = var(EXPLICIT) {
        return Search {
            explicit: Some(path.into()),
            toolkits: Vec::new(),
            sites: Vec::new(),
            python: format!("only {EXPLICIT} was tried"),
            files: Vec::new(),
        };
    }
    let target = format!(
        "targets/{}-linux/lib",
        if cfg!(target_arch = "aarch64") {
            "sbsa"
        } else {
            std::env::consts::ARCH
        }
    );
    let mut toolkits: Vec<PathBuf> = Vec::new();
    for v in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Some(home) = var(v) {
            for sub in ["lib64", "lib", &target] {
                toolkits.push(Path::new(&home).join(sub));
            }
        }
    }
    let mut cudas: Vec<PathBuf> = read_dir_sorted(&root.join("usr/local"))
        .into_iter()
        .filter(|p| name_of(p).is_some_and(|n| n.starts_with("cuda")))
        .collect();
    cudas.reverse();
    for cuda in cudas {
        toolkits.push(cuda.join("lib64"));
        toolkits.push(cuda.join(&target));
    }
    dedup(&mut toolkits);

    let (prefix, python) = python_prefix(&var);
    let sites = prefix.as_deref().map(python_sites).unwrap_or_default();
    let mut files: Vec<PathBuf> = toolkits
        .iter()
        .flat_map(|d| NAMES.map(|n| d.join(n)))
        .collect();
    for site in &sites {
        for dir in ["nvidia/cu13/lib", "nvidia/nvjpeg/lib"] {
            files.extend(NAMES.map(|n| site.join(dir).join(n)));
        }
        // torchvision's wheels carry their own copy under a hashed name.
        files.extend(
            read_dir_sorted(&site.join("torchvision.libs"))
                .into_iter()
                .filter(|p| {
                    name_of(p).is_some_and(|n| n.starts_with("libnvjpeg") && n.contains(".so"))
                }),
        );
    }
    dedup(&mut files);
    Search {
        explicit: None,
        toolkits,
        sites,
        python,
        files,
    }
}

/// The Python environment `PINNABLE_NVJPEG_FROM_PYTHON` names, if any, and what was made of
/// the variable (for the error).
fn python_prefix(var: &dyn Fn(&str) -> Option<String>) -> (Option<PathBuf>, String) {
    let how = format!(
        "set {FROM_PYTHON}=1 to search the active Python environment's NVIDIA wheels \
         ($VIRTUAL_ENV, else $CONDA_PREFIX), or {FROM_PYTHON}=<the environment's folder, \
         Python's sys.prefix>"
    );
    match var(FROM_PYTHON).as_deref() {
        None | Some("0") => (
            None,
            format!("Python environments were not searched ({how})"),
        ),
        Some("1") => match var("VIRTUAL_ENV").or_else(|| var("CONDA_PREFIX")) {
            Some(p) => {
                let note = format!("the active Python environment {p} ({FROM_PYTHON}=1)");
                (Some(p.into()), note)
            }
            None => (
                None,
                format!(
                    "{FROM_PYTHON}=1, but no Python environment is active ($VIRTUAL_ENV and \
                     $CONDA_PREFIX are unset): {how}"
                ),
            ),
        },
        Some(p) if Path::new(p).is_absolute() => (
            Some(p.into()),
            format!("the Python environment {p} ({FROM_PYTHON})"),
        ),
        Some(v) => (
            None,
            format!(
                "{FROM_PYTHON}={v} is neither 1 nor an absolute path, so no Python environment was searched: {how}"
            ),
        ),
    }
}

impl Search {
    /// The error when the library was found nowhere: where it was looked for and how to point
    /// at it; `last` is the last loading error, if a file was there but would not load.
    pub(crate) fn not_found(&self, last: Option<&str>) -> String {
        let list = |v: &[PathBuf]| {
            if v.is_empty() {
                "none".to_owned()
            } else {
                v.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let sites = if self.sites.is_empty() {
            String::new()
        } else {
            format!(" (its wheels in {})", list(&self.sites))
        };
        format!(
            "nvJPEG ({}) was not found. Looked for it on the system loader's path \
             (LD_LIBRARY_PATH, the ldconfig cache, /lib, /usr/lib); in CUDA toolkit folders: \
             {}; {}{sites}. To use a copy elsewhere, set {EXPLICIT}=/path/to/libnvjpeg.so.13 \
             (or add its folder to LD_LIBRARY_PATH); `pip install nvidia-nvjpeg` puts one in \
             a Python environment's nvidia/cu13/lib{}",
            NAMES.join(" or "),
            list(&self.toolkits),
            self.python,
            last.map(|e| format!(". Last error: {e}"))
                .unwrap_or_default()
        )
    }
}

/// `lib/python3*/site-packages` and `dist-packages` under the environment `prefix`, newest
/// Python first.
fn python_sites(prefix: &Path) -> Vec<PathBuf> {
    let mut pythons: Vec<PathBuf> = read_dir_sorted(&prefix.join("lib"))
        .into_iter()
        .filter(|p| name_of(p).is_some_and(|n| n.starts_with("python3")))
        .collect();
    pythons.reverse();
    pythons
        .into_iter()
        .flat_map(|p| [p.join("site-packages"), p.join("dist-packages")])
        .filter(|p| p.is_dir())
        .collect()
}

fn name_of(p: &Path) -> Option<&str> {
    p.file_name().and_then(|n| n.to_str())
}

/// Entries of `dir`, sorted; none if it cannot be listed.
fn read_dir_sorted(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Drops repeats, keeping the first of each.
fn dedup(v: &mut Vec<PathBuf>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|p| seen.insert(p.clone()));
}

#[cfg(test)]
mod tests;
