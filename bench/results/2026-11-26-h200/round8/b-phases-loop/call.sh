#!/usr/bin/env bash
# Device decode: where a worker's time goes (PINNABLE_PHASES), beside nvJPEG alone and torchvision.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/p1.tar.xz -C /tmp; cd /tmp/p1
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_OUT=$R/bench; mkdir -p $R/bench
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
s=$SECONDS; PINNABLE_PHASES=1 PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=1,2,4 PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs timeout 60 ./run.sh benches/images > $R/quick.log 2>&1; echo "quick rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
rm -rf $R/bench/jpegs
cat $R/device.txt; grep -E "^  |^phases|quick" $R/quick.log
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
