#!/usr/bin/env bash
# Two builds' benches side by side, alternating, on one machine in one sitting, then their
# tables compared row by row (bench/compare_runs.py): every row's speed after / before,
# the geometric mean over the rounds, the rows below 0.95x.
#
#   bench/before_after.sh BEFORE_BUNDLE AFTER_BUNDLE OUT [ROUNDS] [BENCH...]
#
# Each bundle is a folder scripts/gpu-bundle.sh made (with PINNABLE_BUNDLE_TARGETS naming the
# benches, e.g. "--bench loader --bench tar"), one of each commit. Round r runs each bench
# before then after (after then before on even rounds), so drift in the machine's state
# falls on both. The JPEG folder the image and tar benches read is generated once
# (torch_images.py, PIL).
set -u
before=$(cd "$1" && pwd); after=$(cd "$2" && pwd); out=$3; rounds=${4:-2}
shift $(( $# < 4 ? $# : 4 ))
benches=${*:-loader gather tokens packing tar images}
mkdir -p "$out"; out=$(cd "$out" && pwd)
if echo "$benches" | grep -qE 'images|tar' && [ ! -d "$out/jpegs" ]; then
    (cd "$after" && python3 torch_images.py --generate "$out/jpegs" >/dev/null)
fi
export PINNABLE_BENCH_IMAGES_DIR=$out/jpegs
for r in $(seq 1 "$rounds"); do
    for b in $benches; do
        order="before after"; [ $((r % 2)) = 0 ] && order="after before"
        for v in $order; do
            case $b in
                loader) envs="PINNABLE_BENCH_WORKERS=12" ;;
                images) envs="PINNABLE_BENCH_ONLY=device" ;;
                tar) envs="PINNABLE_BENCH_WORKERS=8,14" ;;
                *) envs="" ;;
            esac
            dir=$before; [ $v = after ] && dir=$after
            (cd "$dir" && env $envs PINNABLE_BENCH_OUT="$out/$v-$b-$r" ./run.sh "benches/$b" \
                >"$out/$v-$b-$r.log" 2>&1) || echo "$b $v round $r failed: $out/$v-$b-$r.log"
        done
    done
done
for b in $benches; do
    args=()
    for r in $(seq 1 "$rounds"); do args+=("$out/before-$b-$r/$b.md" "$out/after-$b-$r/$b.md"); done
    echo "=== $b"
    python3 "$(dirname "$0")/compare_runs.py" "${args[@]}"
done
