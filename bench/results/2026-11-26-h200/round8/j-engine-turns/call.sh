#!/usr/bin/env bash
# Device decode, decoding streams that never wait on another stream: tests; a hang check (4 and
# 8 workers, repeated) beside the build before; the device table and host shares.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/n3.tar.xz -C /tmp; 
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
mkdir -p $R/twin; s=$SECONDS; timeout 60 python3 $root/bench/torch_images.py --dir /tmp/jpegs --out $R/twin/torch_images.txt --gpu-decode-only > $R/images_twin.log 2>&1; echo "twin rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
for b in n3; do mkdir -p $R/$b; cp $R/twin/torch_images.txt $R/$b/; done
cd /tmp/n3
s=$SECONDS; timeout 90 ./run.sh tests/images_gpu --test-threads=1 > $R/tests.log 2>&1; echo "images_gpu rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
for b in n3 n3; do
  cd /tmp/$b
  for w in 4 4 4 4 8 8 8 8; do
    s=$SECONDS; PINNABLE_BENCH_OUT=$R/$b PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=$w timeout 20 ./run.sh benches/images > $R/hang.log 2>&1
    echo "hang check $b $w workers: rc=$? ($((SECONDS-s)) s) $(grep -E '^\| u8' $R/hang.log | cut -d'|' -f6,7,11)" >> $R/hang.txt
  done
done
cd /tmp/n3
s=$SECONDS; PINNABLE_BENCH_OUT=$R/n3 PINNABLE_BENCH_ONLY=device timeout 150 ./run.sh benches/images > $R/table.log 2>&1; echo "table rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; PINNABLE_BENCH_OUT=$R/n3 PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=2,3,4,2,3,4,8:0.04,12:0.06,16:0.08 timeout 90 ./run.sh benches/images > $R/quick.log 2>&1; echo "quick rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
rm -rf $R/*/jpegs
cat $R/device.txt; grep -E "test result|FAILED|panicked" $R/tests.log | head -3; grep tv_gpu_decode_best $R/twin/torch_images.txt; cat $R/hang.txt
for f in $R/table.log $R/quick.log; do echo "== $f"; grep -E "^\| (u8|f32)" $f | cut -d'|' -f2-4,6-12; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
