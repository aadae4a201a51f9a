#!/usr/bin/env bash
# Round 8: a batch's files opened once (n4) against sized by path then opened (g9), alternating,
# the device decoder's u8 rows at 1 and 2 workers; then n4's GPU image tests.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/n4.tar.xz -C /tmp; tar -xJf bundle/g9.tar.xz -C /tmp
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
mkdir -p $R/twin; timeout 90 python3 $root/bench/torch_images.py --dir /tmp/jpegs --out $R/twin/torch_images.txt --gpu-decode-only > $R/images_twin.log 2>&1; echo "twin rc=$?" >> $R/device.txt
for b in g9 n4 g9 n4 g9 n4; do
  mkdir -p $R/$b; cp $R/twin/torch_images.txt $R/$b/
  cd /tmp/$b; PINNABLE_BENCH_OUT=$R/$b PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=1,2,1,2 timeout 60 ./run.sh benches/images > $R/q.log 2>&1
  echo "$b rc=$?" >> $R/device.txt; grep -E "^\| u8" $R/q.log | sed "s/^/$b /" >> $R/rows.txt
done
cd /tmp/n4; s=$SECONDS; timeout 90 ./run.sh tests/images_gpu --test-threads=1 > $R/tests.log 2>&1; echo "images_gpu rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
rm -rf $R/*/jpegs $R/q.log
cat $R/device.txt; grep tv_gpu_decode_best $R/twin/torch_images.txt; grep -E "test result" $R/tests.log; cut -d'|' -f1,4,6,7,8 $R/rows.txt
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
