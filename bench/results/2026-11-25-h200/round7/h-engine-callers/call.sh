#!/usr/bin/env bash
# Device decode: how many threads may be inside the engines' batched decode at once.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/d1.tar.xz -C /tmp; cd /tmp/d1
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_OUT=$R/bench; mkdir -p $R/bench
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
s=$SECONDS; timeout 60 ./run.sh tests/images_gpu > $R/tests.log 2>&1; echo "images_gpu rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; timeout 60 python3 $root/bench/torch_images.py --dir /tmp/jpegs --out $R/bench/torch_images.txt --gpu-decode-only > $R/images_twin.log 2>&1; echo "images twin rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
for pass in 1 2; do for slots in 2 99 1 3; do
  echo "== engine callers $slots (pass $pass)" >> $R/quick.log
  PINNABLE_X_SLOTS=$slots PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=2,3,4,6 PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs timeout 40 ./run.sh benches/images 2>&1 | grep -E "^\| u8 \| quick|error" >> $R/quick.log
done; done
rm -rf $R/bench/jpegs
cat $R/device.txt; grep -E "test result|FAILED|panicked" $R/tests.log | head -3; grep tv_gpu_decode_best $R/bench/torch_images.txt; cat $R/quick.log
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
