#!/usr/bin/env bash
# Round 8: tar shards over the local HTTP server in a steady window of one long epoch (the
# shards listed 40 times), beside the same window on local files and the kept-open ceiling.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/t8.tar.xz -C /tmp; cd /tmp/t8
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_DECODE=0 PINNABLE_BENCH_WORKERS=8,14
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
for t in 4 8 4 8; do
  mkdir -p $R/t$t-$SECONDS; o=$(ls -d $R/t$t-* | tail -1)
  s=$SECONDS; PINNABLE_BENCH_OUT=$o PINNABLE_BENCH_THREADS=$t timeout 150 ./run.sh benches/tar > $o/tar.log 2>&1; echo "tar threads $t rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
  rm -rf $o/tar-shards $o/jpegs
done
cat $R/device.txt
for o in $R/t*; do echo "== $o"; grep -E "^\| (ours over HTTP, fields|local files, fields|plain|object_store)|^HTTP ceiling|^\| (8|14) \||^# steady" $o/tar.log; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
