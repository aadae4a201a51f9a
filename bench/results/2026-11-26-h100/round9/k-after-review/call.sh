#!/usr/bin/env bash
# Round 9, after the review's changes (a shared thread-stream helper for the device decoder
# and packer, the engines' turn waking waiters only when one more may enter): the library's
# unit tests, the GPU image, packing and token tests (PINNABLE_REQUIRE_GPU=1); the device
# decode table and u8 rows beside torchvision's twin; a hang check.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/r9.tar.xz -C /tmp; cd /tmp/r9
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_OUT=$R/bench; mkdir -p $R/bench
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
for t in pinnable-lib images_gpu packing_gpu tokens_gpu; do
  s=$SECONDS; PINNABLE_REQUIRE_GPU=1 timeout 150 ./run.sh tests/$t > $R/test-$t.log 2>&1; echo "$t rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
done
s=$SECONDS; timeout 90 python3 $root/bench/torch_images.py --dir /tmp/jpegs --out $R/bench/torch_images.txt --gpu-decode-only > $R/images_twin.log 2>&1; echo "twin rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; PINNABLE_BENCH_ONLY=device timeout 150 ./run.sh benches/images > $R/table.log 2>&1; echo "table rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=2,2,4,2:0:2,1,2 timeout 120 ./run.sh benches/images > $R/quick.log 2>&1; echo "quick rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
for w in 4 8 4:0:2 8:0:2 8:0.06:2 4 8 4:0:2; do
  s=$SECONDS; PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=$w timeout 20 ./run.sh benches/images > $R/hang.log 2>&1
  echo "hang check $w workers: rc=$? ($((SECONDS-s)) s) $(grep -E '^\| u8' $R/hang.log | cut -d'|' -f4,5,7,8,12)" >> $R/hang.txt
done
rm -rf $R/bench/jpegs $R/hang.log
cat $R/device.txt $R/hang.txt
grep -hE "^test result|FAILED|panicked|^skipped" $R/test-*.log | sort | uniq -c | head -12
grep -E "tv_gpu_decode_best|tv_gpu_pipeline_best" $R/bench/torch_images.txt
grep -hE "^\| (u8|f32)" $R/table.log $R/quick.log | cut -d'|' -f1-13
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
