#!/usr/bin/env bash
# Round 9, the final code: DeviceImageBatcher::engine_threads (1 by default, 2 beside host
# shares); the device-decode table twice and u8 rows (workers:host share:engine threads) twice,
# beside torchvision's twin; the GPU image tests.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/s9d.tar.xz -C /tmp; cd /tmp/s9d
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_OUT=$R/bench; mkdir -p $R/bench
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
s=$SECONDS; timeout 90 python3 $root/bench/torch_images.py --dir /tmp/jpegs --out $R/bench/torch_images.txt --gpu-decode-only > $R/images_twin.log 2>&1; echo "twin rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; PINNABLE_REQUIRE_GPU=1 timeout 120 ./run.sh tests/images_gpu --test-threads=1 > $R/tests.log 2>&1; echo "images_gpu rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
for k in 1 2; do
  s=$SECONDS; PINNABLE_BENCH_ONLY=device timeout 150 ./run.sh benches/images > $R/table-$k.log 2>&1; echo "table $k rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
done
for k in 1 2; do
  s=$SECONDS; PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=2:0:1,3:0:1,4:0:1,2:0:2,4:0:2,8:0.06:1,8:0.06:2,8:0.10:2,16:0.10:2 timeout 120 ./run.sh benches/images > $R/quick-$k.log 2>&1; echo "quick $k rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
done
rm -rf $R/bench/jpegs
cat $R/device.txt; grep -E "test result" $R/tests.log; grep -E "best" $R/bench/torch_images.txt
for f in $R/table-*.log $R/quick-*.log; do echo "== $f"; grep -E "^\| (u8|f32)" $f | cut -d'|' -f1-12; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
