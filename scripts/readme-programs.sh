#!/usr/bin/env bash
# Does with the README what a new user does: every ```rust block of README.md that is a program
# (it has `fn main`) becomes src/main.rs of its own fresh crate, which depends on this checkout's
# `pinnable` by path with the features its section's heading names ("(feature `image`)"); each
# crate is built alone (so a feature the heading forgets is a build error, not borrowed from a
# neighbour), with warnings denied in its own code, and its binary run. Any error fails the script.
#
# A block that reads its command line runs twice: without arguments, as a user first runs it,
# and with the arguments below (the image block gets a folder made of the test seeds' images;
# the tar block's remote part needs a URL this machine cannot reach, so it runs without one).
#
# The crates live in one workspace under a temporary folder (one build, shared dependencies,
# this checkout's Cargo.lock); builds go to $CARGO_TARGET_DIR when set, so they share its cache.
#
#   scripts/readme-programs.sh          # builds and runs every program
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/readme-programs.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$work/target}"

# Writes $work/<crate>/{Cargo.toml,src/main.rs}, the workspace's Cargo.toml, and one line per
# crate in $work/crates: its name, its features and the heading it came from.
python3 - "$root" "$work" <<'EOF'
import re, sys, pathlib

root, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
heading, block, blocks = "", None, []
for line in (root / "README.md").read_text().splitlines():
    if block is not None:
        if line.startswith("```"):
            blocks.append((heading, "\n".join(block) + "\n"))
            block = None
        else:
            block.append(line)
    elif line.startswith("```rust"):
        block = []
    elif line.startswith("#"):
        heading = line.lstrip("#").strip()
programs = [(h, code) for h, code in blocks if re.search(r"^fn main\(", code, re.M)]
if not programs:
    sys.exit("README.md has no ```rust block with `fn main`")
names = []
for i, (h, code) in enumerate(programs, 1):
    if re.search(r"^# ", code, re.M):
        sys.exit(f"the block under '{h}' has hidden lines (`# `): a user cannot paste it as is")
    features = []
    m = re.search(r"\(features? ([^)]*)\)", h)
    if m:
        features = re.findall(r"`([^`]+)`", m.group(1))
    slug = re.sub(r"[^a-z0-9]+", "-", h.lower()).strip("-")[:40].strip("-")
    name = f"readme-{i:02}-{slug}"
    names.append(name)
    (work / name / "src").mkdir(parents=True)
    (work / name / "src" / "main.rs").write_text(code)
    feats = ", ".join(f'"{f}"' for f in features)
    (work / name / "Cargo.toml").write_text(
        f'[package]\nname = "{name}"\nversion = "0.1.0"\nedition = "2024"\npublish = false\n\n'
        f'[dependencies]\npinnable = {{ path = "{root / "pinnable"}", features = [{feats}] }}\n'
    )
    with open(work / "crates", "a") as f:
        f.write(f"{name}\t{','.join(features) or '-'}\t{h}\n")
members = ", ".join(f'"{n}"' for n in names)
(work / "Cargo.toml").write_text(f'[workspace]\nmembers = [{members}]\nresolver = "3"\n')
EOF
cp "$root/Cargo.lock" "$work/Cargo.lock"

# The image block's folder: two classes of the decoder tests' small seed images (JPEG and PNG).
images="$work/images"
mkdir -p "$images/a" "$images/b"
seeds="$root/pinnable/tests/data/seeds"
cp "$seeds/baseline-444.jpg" "$seeds/baseline-420-large.jpg" "$images/a/"
cp "$seeds/progressive-420.jpg" "$seeds/rgb.png" "$seeds/palette.png" "$images/b/"

while IFS=$'\t' read -r name features heading; do
    echo "--- $heading: $name (features: $features)"
    (cd "$work" && cargo rustc --quiet -p "$name" --bin "$name" -- -D warnings)
    bin="$CARGO_TARGET_DIR/debug/$name"
    runs=("")
    if grep -q 'std::env::args' "$work/$name/src/main.rs"; then
        case "$heading" in
        *"image folder"*) runs+=("$images") ;;
        esac
    fi
    for arg in "${runs[@]}"; do
        echo "\$ $name${arg:+ $arg}"
        # Each program runs in its own crate's folder, as `cargo run` does.
        (cd "$work/$name" && timeout 300 "$bin" ${arg:+"$arg"})
    done
done <"$work/crates"
echo "every README program built and ran: $(wc -l <"$work/crates")"
