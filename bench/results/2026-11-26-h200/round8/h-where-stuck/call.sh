#!/usr/bin/env bash
# Device decode, 3 to 8 workers repeated: where each thread is when batches stop (a watchdog in
# the instrumented bench), and whether letting fewer threads into the engines at once helps.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/x1.tar.xz -C /tmp
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_OUT=$R/b PINNABLE_PHASES=1 PINNABLE_BENCH_ONLY=device-quick
mkdir -p $R/b
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
cd /tmp/x1
k=0
for spec in 4:- 4:- 4:- 4:- 4:- 4:- 4:2 4:2 4:2 4:2 4:2 4:2 4:1 4:1 4:1 3:- 3:- 3:- 8:- 8:- 8:-; do
  k=$((k+1)); w=${spec%%:*}; e=${spec##*:}
  if [ $e = - ]; then unset PINNABLE_X_ENGINES; else export PINNABLE_X_ENGINES=$e; fi
  s=$SECONDS; PINNABLE_BENCH_WORKERS=$w timeout 25 ./run.sh benches/images > $R/run$k.log 2>&1; rc=$?
  echo "$k workers $w engines $e: rc=$rc ($((SECONDS-s)) s) $(grep -E '^\| u8' $R/run$k.log | cut -d'|' -f6,7)" >> $R/runs.txt
done
rm -rf $R/b/jpegs
cat $R/device.txt $R/runs.txt
for f in $R/run*.log; do if grep -q STUCK $f; then echo "== $f"; grep -A14 STUCK $f; fi; done | head -120
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
