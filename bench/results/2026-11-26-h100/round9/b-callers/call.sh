#!/usr/bin/env bash
# Round 9: one or two threads at a time in the engines' call (PINNABLE_X_CALLERS) against the device
# decoder's CPU time, u8 rows at 1 and 2 workers, beside torchvision's twin.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/s9b.tar.xz -C /tmp; cd /tmp/s9b
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_OUT=$R/bench; mkdir -p $R/bench
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
s=$SECONDS; timeout 90 python3 $root/bench/torch_images.py --dir /tmp/jpegs --out $R/bench/torch_images.txt --gpu-decode-only > $R/images_twin.log 2>&1; echo "twin rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
for cfg in 2:2 1:2 1:3 2:2 1:2 1:3 1:4; do
  c=${cfg%%:*}; w=${cfg#*:}
  s=$SECONDS; PINNABLE_X_CALLERS=$c PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=$w,$w,$w timeout 80 ./run.sh benches/images > $R/quick-c$c-w$w-$s.log 2>&1; echo "quick callers $c workers $w rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
done
rm -rf $R/bench/jpegs
cat $R/device.txt; grep -E "best" $R/bench/torch_images.txt
for f in $R/quick-c*.log; do echo "== $f"; grep -E "^primary|^\| (u8|f32)" $f | cut -d'|' -f1-12; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
