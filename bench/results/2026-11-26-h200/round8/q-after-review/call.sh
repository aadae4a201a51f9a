#!/usr/bin/env bash
# Round 8, after the last review: the final code's device-decode table and its u8 rows at 1 to 3 workers,
# beside torchvision's twin; the GPU image tests.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/n5.tar.xz -C /tmp; cd /tmp/n5
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_OUT=$R/bench; mkdir -p $R/bench
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
s=$SECONDS; timeout 90 python3 $root/bench/torch_images.py --dir /tmp/jpegs --out $R/bench/torch_images.txt --gpu-decode-only > $R/images_twin.log 2>&1; echo "twin rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; timeout 90 ./run.sh tests/images_gpu --test-threads=1 > $R/tests.log 2>&1; echo "images_gpu rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=1,2,4 timeout 60 ./run.sh benches/images > $R/images.log 2>&1; echo "images bench rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
rm -rf $R/bench/jpegs
cat $R/device.txt; grep -E "test result" $R/tests.log; grep -E "best" $R/bench/torch_images.txt
grep -E "^\| (u8|f32)" $R/images.log $R/images_quick.log | cut -d'|' -f2-12
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
