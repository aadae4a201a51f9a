#!/usr/bin/env bash
# Round 7, the final GPU call: every bundled test and example (PINNABLE_REQUIRE_GPU=1); device
# JPEG decode beside torchvision's; tar shards over the local HTTP server; burn.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
{ date -u; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/g7.tar.xz -C /tmp; cd /tmp/g7
export PINNABLE_BENCH_DATA=/tmp; mkdir -p $R/bench
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
s=$SECONDS; timeout 200 ./run.sh tests > $R/tests.log 2>&1; echo "tests rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; timeout 100 ./run.sh examples > $R/examples.log 2>&1; echo "examples rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
export PINNABLE_BENCH_OUT=$R/bench
s=$SECONDS; timeout 90 python3 $root/bench/torch_images.py --dir /tmp/jpegs --out $R/bench/torch_images.txt --gpu-decode-only > $R/images_twin.log 2>&1; echo "images twin rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; PINNABLE_BENCH_ONLY=device PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs timeout 120 ./run.sh benches/images > $R/images.log 2>&1; echo "images bench rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
for pass in 1; do PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=1,2,3,4 PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs timeout 60 ./run.sh benches/images 2>&1 | grep -E "^\| u8 \| quick|tv_gpu_decode_best" >> $R/images_quick.log; done
s=$SECONDS; PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_WORKERS=8,14 timeout 120 ./run.sh benches/tar > $R/tar.log 2>&1; echo "tar bench rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_WORKERS=8,14 PINNABLE_BENCH_DECODE=0 PINNABLE_BENCH_THREADS=8 timeout 90 ./run.sh benches/tar > $R/tar_t8.log 2>&1; echo "tar bench threads 8 rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
if [ -x benches/burn ]; then s=$SECONDS; timeout 120 ./run.sh benches/burn > $R/burn.log 2>&1; echo "burn bench rc=$? ($((SECONDS-s)) s)" >> $R/device.txt; fi
rm -rf $R/bench/jpegs $R/bench/tar-shards
cat $R/device.txt
grep -E "^test result|FAILED|panicked" $R/tests.log | sort | uniq -c | sort -rn | head -8
grep -E "FAILED|panicked|error" $R/examples.log | head -5
grep -E "^\| (u8|f32)|tv_gpu_decode_best|tv_gpu_pipeline_best|^- " $R/images.log | head -24; cat $R/images_quick.log
grep -E "^\|" $R/tar.log | tail -16; grep -E "^\|" $R/tar_t8.log | tail -10; tail -20 $R/burn.log 2>/dev/null
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
