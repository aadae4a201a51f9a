#!/usr/bin/env bash
# Device decode with 4 workers: where each thread is when batches stop coming; with and without
# nvJPEG handles opened one at a time.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/p1.tar.xz -C /tmp; cd /tmp/p1
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_OUT=$R/bench; mkdir -p $R/bench
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
k=0
for v in plain serial plain serial plain serial one; do
  k=$((k+1)); s=$SECONDS; w=4; [ $v = one ] && w=1
  if [ $v = serial ]; then export PINNABLE_X_SERIAL=1; else unset PINNABLE_X_SERIAL; fi
  PINNABLE_PHASES=1 PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=$w PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs timeout 30 ./run.sh benches/images > $R/q$k-$v.log 2>&1
  echo "$k $v workers $w rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
done
rm -rf $R/bench/jpegs
cat $R/device.txt; for f in $R/q*.log; do echo "== $f"; grep -E "quick|STUCK|^  [a-zA-Z0-9-]+-ThreadId" $f; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
