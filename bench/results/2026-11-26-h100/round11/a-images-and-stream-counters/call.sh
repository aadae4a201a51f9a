#!/usr/bin/env bash
# Round 11: #27's device table on an H100 on the code as it lands (g11a), beside torchvision's
# twin; then benches/tar's steady window with the remote stream's counters (experiment build
# t11i: lock waits and holds, condvar waits, fetch times, read-ahead breaks), long window.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site PINNABLE_REQUIRE_GPU=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader; nproc; cat bundle/g11a.commit; } > $R/device.txt
tar -xJf bundle/g11a.tar.xz -C /tmp; tar -xJf bundle/t11i.tar.xz -C /tmp
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs; mkdir -p $R/images
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
cd /tmp/g11a
export PINNABLE_BENCH_OUT=$R/images
s=$SECONDS; timeout 90 python3 $root/bench/torch_images.py --dir /tmp/jpegs --out $R/images/torch_images.txt --gpu-decode-only > $R/images_twin.log 2>&1; echo "images twin rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; PINNABLE_BENCH_ONLY=device timeout 150 ./run.sh benches/images > $R/images.log 2>&1; echo "images bench rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=1,2,3,4,2:0:2,8:0.06:2,8:0.03:2,1,2,3,4,2:0:2,8:0.06:2,8:0.03:2 timeout 120 ./run.sh benches/images > $R/images_quick.log 2>&1; echo "images quick rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
rm -rf $R/images/jpegs
cd /tmp/t11i
export PINNABLE_BENCH_DECODE=0 PINNABLE_BENCH_REPEAT=200 PINNABLE_BENCH_WINDOW=4000
for cfg in 4096:4:4:8 2048:16:8:8 4096:8:12:8 2048:16:8:14 4096:4:4:8 2048:16:8:8; do
  IFS=: read c a t w <<< "$cfg"
  s=$SECONDS; o=$R/t11i-c$c-a$a-t$t-w$w; mkdir -p $o
  PINNABLE_BENCH_WORKERS=$w PINNABLE_BENCH_OUT=$o PINNABLE_BENCH_CHUNK_KIB=$c PINNABLE_BENCH_READ_AHEAD=$a PINNABLE_BENCH_THREADS=$t timeout 100 ./run.sh benches/tar > $o/tar.log 2>&1; echo "chunk $c KiB, read ahead $a, threads $t, workers $w: rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
  rm -rf $o/tar-shards $o/jpegs
done
cat $R/device.txt
grep -E "tv_gpu_decode_best|tv_gpu_pipeline_best" $R/images/torch_images.txt
grep -E "^\| (u8|f32)" $R/images.log $R/images_quick.log | cut -d'|' -f2-12
for o in $R/t11i*; do echo "== $o"; grep -E "^HTTP ceiling, every|^\| (8|14) \||^STATS takes [1-9]" $o/tar.log | cut -c1-600; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
