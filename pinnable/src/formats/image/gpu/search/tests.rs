use std::path::{Path, PathBuf};

use super::{NAMES, Search, search};
use crate::formats::image::gpu::tests::seed;

/// A made-up file system: the folders and (empty) files given, under a fresh temporary root.
struct Tree(PathBuf);

impl Tree {
    fn new(test: &str, files: &[&str]) -> Tree {
        let root = std::env::temp_dir().join(format!("pinnable-{test}-{}", seed(test)));
        for f in files {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, b"not a library").unwrap();
        }
        Tree(root)
    }

    fn at(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The search with the variables `env` and the file system under `root`.
fn search_in(env: &[(&str, String)], root: &Path) -> Search {
    search(
        &|k| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()),
        root,
    )
}

/// Every path the search would try: the named one, or the files.
fn tried(env: &[(&str, String)], root: &Path) -> Vec<PathBuf> {
    let s = search_in(env, root);
    s.explicit.into_iter().chain(s.files).collect()
}

const HOME_WHEEL: &str =
    "home/u/.local/lib/python3.12/site-packages/nvidia/cu13/lib/libnvjpeg.so.13";
const HOME_TV: &str =
    "home/u/.local/lib/python3.12/site-packages/torchvision.libs/libnvjpeg.1a2b.so.13";
const OPT_WHEEL: &str = "opt/x/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvjpeg.so.13";
const OPT_TV: &str =
    "opt/x/.venv/lib/python3.12/site-packages/torchvision.libs/libnvjpeg.3c4d.so.13";
const USR_WHEEL: &str = "usr/local/lib/python3.12/dist-packages/nvidia/cu13/lib/libnvjpeg.so.13";
const TOOLKIT: &str = "usr/local/cuda-13.0/lib64/libnvjpeg.so.13";

/// Libraries planted in folders a user can write to (`~/.local`, `/opt/*/.venv`, an
/// environment's wheels) are never among the candidates unless the user names them; the
/// toolkit's is; with the opt-in, the active environment's wheels (and only its) are.
#[test]
fn planted_libraries_in_user_folders_are_never_candidates() {
    let t = Tree::new(
        "nvjpeg-search",
        &[HOME_WHEEL, HOME_TV, OPT_WHEEL, OPT_TV, USR_WHEEL, TOOLKIT],
    );
    let home = t.at("home/u").display().to_string();
    let venv = t.at("opt/x/.venv").display().to_string();
    let planted = [HOME_WHEEL, HOME_TV, OPT_WHEEL, OPT_TV, USR_WHEEL].map(|p| t.at(p));
    let never = |c: &[PathBuf], but: &[&PathBuf]| {
        for p in &planted {
            if !but.contains(&p) {
                assert!(!c.contains(p), "{} is a candidate: {c:#?}", p.display());
            }
        }
        for p in c {
            let under_home = p.starts_with(t.at("home"));
            assert!(!under_home || but.contains(&p), "{}", p.display());
        }
    };

    // No opt-in: HOME and VIRTUAL_ENV are set, and neither is searched.
    let base = vec![("HOME", home.clone()), ("VIRTUAL_ENV", venv.clone())];
    let c = tried(&base, &t.0);
    never(&c, &[]);
    assert!(c.contains(&t.at(TOOLKIT)), "{c:#?}");
    assert!(c.iter().all(|p| !p.starts_with(t.at("opt"))), "{c:#?}");

    // The opt-in takes the active environment's wheels, after the toolkit.
    for v in ["1".to_owned(), venv.clone()] {
        let mut env = base.clone();
        env.push(("PINNABLE_NVJPEG_FROM_PYTHON", v));
        let c = tried(&env, &t.0);
        let (w, tv) = (t.at(OPT_WHEEL), t.at(OPT_TV));
        never(&c, &[&w, &tv]);
        let at = |p: &PathBuf| c.iter().position(|x| x == p).expect("a candidate");
        assert!(at(&t.at(TOOLKIT)) < at(&w) && at(&w) < at(&tv), "{c:#?}");
        assert!(c.contains(
            &t.at("opt/x/.venv/lib/python3.12/site-packages/nvidia/nvjpeg/lib/libnvjpeg.so.12")
        ));
    }
    // Opted in with no active environment: nothing from Python, and the error says why.
    let env = vec![
        ("HOME", home.clone()),
        ("PINNABLE_NVJPEG_FROM_PYTHON", "1".to_owned()),
    ];
    never(&tried(&env, &t.0), &[]);
    let s = search_in(&env, &t.0);
    assert!(
        s.not_found(None)
            .contains("no Python environment is active"),
        "{}",
        s.not_found(None)
    );

    // A path the user names is the only candidate, wherever it is.
    let mut env = base.clone();
    env.push(("PINNABLE_NVJPEG", t.at(HOME_WHEEL).display().to_string()));
    env.push(("PINNABLE_NVJPEG_FROM_PYTHON", "1".to_owned()));
    assert_eq!(tried(&env, &t.0), [t.at(HOME_WHEEL)]);
}

/// Toolkits the variables name come first, in the variables' order, each with its `lib64`,
/// `lib` and target folder; then `/usr/local/cuda*`, newest first.
#[test]
fn toolkits_in_order() {
    let t = Tree::new(
        "nvjpeg-toolkits",
        &[
            "usr/local/cuda-12.8/lib64/libnvjpeg.so.12",
            "usr/local/cuda-13.0/lib64/libnvjpeg.so.13",
            "usr/local/lib/libnvjpeg.so.13",
        ],
    );
    let env = vec![
        ("CUDA_PATH", "/p".to_owned()),
        ("CUDA_HOME", "/h".to_owned()),
    ];
    let c = tried(&env, &t.0);
    let at = |p: &Path| {
        c.iter()
            .position(|x| x == p)
            .unwrap_or_else(|| panic!("{} not in {c:#?}", p.display()))
    };
    let order = [
        PathBuf::from("/h/lib64").join(NAMES[0]),
        PathBuf::from("/h/lib").join(NAMES[0]),
        PathBuf::from("/p/lib64").join(NAMES[0]),
        t.at("usr/local/cuda-13.0/lib64").join(NAMES[0]),
        t.at("usr/local/cuda-12.8/lib64").join(NAMES[1]),
    ];
    for w in order.windows(2) {
        assert!(at(&w[0]) < at(&w[1]), "{:?} before {:?}", w[0], w[1]);
    }
    // `/usr/local/lib` is not a toolkit folder (the system loader searches what ldconfig
    // lists).
    assert!(
        !c.iter().any(|p| p.starts_with(t.at("usr/local/lib"))),
        "{c:#?}"
    );
}

/// Not found: the error lists where it looked and says how to point at the library.
#[test]
fn the_error_lists_where_it_looked_and_how_to_point_at_it() {
    let t = Tree::new("nvjpeg-missing", &["usr/local/cuda-13.0/lib64/other.so"]);
    let env = [("CUDA_HOME", "/h".to_owned())];
    let s = search_in(&env, &t.0);
    let e = s.not_found(Some("libnvjpeg.so.12: cannot open shared object file"));
    println!("{e}");
    for want in [
        "libnvjpeg.so.13 or libnvjpeg.so.12".to_owned(),
        "LD_LIBRARY_PATH".to_owned(),
        "/h/lib64".to_owned(),
        t.at("usr/local/cuda-13.0/lib64").display().to_string(),
        "PINNABLE_NVJPEG=/path/to/libnvjpeg.so.13".to_owned(),
        "PINNABLE_NVJPEG_FROM_PYTHON=1".to_owned(),
        "were not searched".to_owned(),
        "cannot open shared object file".to_owned(),
    ] {
        assert!(e.contains(&want), "{want:?} is not in: {e}");
    }
}
