#!/usr/bin/env bash
# Device decode: a timeline of batches through worker, transfer thread and consumer; a watch for hangs.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/p1.tar.xz -C /tmp; cd /tmp/p1
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_OUT=$R/bench; mkdir -p $R/bench
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
for w in 1,2,4 4 4; do
  s=$SECONDS
  PINNABLE_PHASES=1 PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=$w PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs ./run.sh benches/images > $R/quick-$w-$s.log 2>&1 &
  pid=$!
  for i in $(seq 1 40); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then
    echo "workers $w: still running after 40 s; threads:" >> $R/device.txt
    for t in /proc/$pid/task/*; do echo "$(cat $t/comm) $(cat $t/wchan) $(cut -d' ' -f3 $t/stat)"; cat $t/stack 2>/dev/null | head -8; done >> $R/device.txt 2>&1
    kill -9 $pid
  fi
  wait $pid; echo "workers $w rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
done
rm -rf $R/bench/jpegs
cat $R/device.txt; for f in $R/quick-*.log; do echo "== $f"; grep -E "^  |^phases|quick|^timeline" $f; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
