#!/usr/bin/env bash
# Device decode, states kept across epochs: tests; a hang check (4 workers, repeated) before and
# after; the device table; host shares; the epoch's end before and after.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/n1.tar.xz -C /tmp; tar -xJf bundle/b1.tar.xz -C /tmp
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
mkdir -p $R/twin; s=$SECONDS; timeout 60 python3 $root/bench/torch_images.py --dir /tmp/jpegs --out $R/twin/torch_images.txt --gpu-decode-only > $R/images_twin.log 2>&1; echo "twin rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
for b in n1 b1; do mkdir -p $R/$b; cp $R/twin/torch_images.txt $R/$b/; done
cd /tmp/n1
s=$SECONDS; timeout 90 ./run.sh tests/images_gpu --test-threads=1 > $R/tests.log 2>&1; echo "images_gpu rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
for b in b1 n1 b1 n1; do
  cd /tmp/$b
  for i in 1 2 3 4 5; do
    s=$SECONDS; PINNABLE_BENCH_OUT=$R/$b PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=4 timeout 20 ./run.sh benches/images > $R/hang-$b-$i.log 2>&1
    echo "hang check $b 4 workers: rc=$? ($((SECONDS-s)) s) $(grep -E '^\| u8' $R/hang-$b-$i.log)" >> $R/hang.txt
  done
done
for b in b1 n1; do
  cd /tmp/$b; PINNABLE_BENCH_OUT=$R/$b PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=1,2,4,1,2,4 timeout 60 ./run.sh benches/images > $R/quick-$b.log 2>&1
  echo "quick $b rc=$?" >> $R/device.txt
done
cd /tmp/n1
s=$SECONDS; PINNABLE_BENCH_OUT=$R/n1 PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=4:0.02,8:0.04,8:0.08,16:0.06,16:0.1,16:0.14 timeout 90 ./run.sh benches/images > $R/shares.log 2>&1; echo "shares rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; PINNABLE_BENCH_OUT=$R/n1 PINNABLE_BENCH_ONLY=device timeout 120 ./run.sh benches/images > $R/table.log 2>&1; echo "table rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
rm -rf $R/*/jpegs
cat $R/device.txt; grep -E "test result|FAILED|panicked|skipped" $R/tests.log | head; grep tv_gpu_decode_best $R/twin/torch_images.txt; cat $R/hang.txt | cut -c1-150
for f in $R/quick-b1.log $R/quick-n1.log $R/shares.log $R/table.log; do echo "== $f"; grep -E "^\| (u8|f32)" $f; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
