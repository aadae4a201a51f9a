#!/usr/bin/env bash
# Round 9: which threads are busy in the device-decode rows (a last column per row): the table
# twice and u8 rows (workers:host share:engine threads) twice, beside torchvision's twin.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/s9e.tar.xz -C /tmp; cd /tmp/s9e
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_OUT=$R/bench; mkdir -p $R/bench
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
s=$SECONDS; timeout 90 python3 $root/bench/torch_images.py --dir /tmp/jpegs --out $R/bench/torch_images.txt --gpu-decode-only > $R/images_twin.log 2>&1; echo "twin rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
for k in 1 2; do
  s=$SECONDS; PINNABLE_BENCH_ONLY=device timeout 150 ./run.sh benches/images > $R/table-$k.log 2>&1; echo "table $k rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
done
for k in 1 2; do
  s=$SECONDS; PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=2,2,4,2:0:2,1,2 timeout 120 ./run.sh benches/images > $R/quick-$k.log 2>&1; echo "quick $k rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
done
rm -rf $R/bench/jpegs
cat $R/device.txt; grep -E "best" $R/bench/torch_images.txt
for f in $R/table-*.log $R/quick-*.log; do echo "== $f"; grep -E "^\| (u8|f32)" $f | cut -d'|' -f1-14; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
