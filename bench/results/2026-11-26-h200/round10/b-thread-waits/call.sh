#!/usr/bin/env bash
# Round 10: where the threads wait in the steady windows (local files, then over HTTP), sampled
# from /proc every ~5 ms; a long window (REPEAT, WINDOW knobs of an experiment build, t10b).
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; which perf; } > $R/device.txt 2>&1
tar -xJf bundle/t10b.tar.xz -C /tmp
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_DECODE=0 PINNABLE_BENCH_WORKERS=8 PINNABLE_BENCH_REPEAT=200 PINNABLE_BENCH_WINDOW=4000
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
for cfg in 2048:16:8 4096:8:12; do
  IFS=: read c a t <<< "$cfg"
  s=$SECONDS; o=$R/t10b-c$c-a$a-t$t; mkdir -p $o
  python3 bundle/sample_threads.py $o/tar.log $o/threads.md > /dev/null 2>&1 &
  (cd /tmp/t10b && PINNABLE_BENCH_OUT=$o PINNABLE_BENCH_CHUNK_KIB=$c PINNABLE_BENCH_READ_AHEAD=$a PINNABLE_BENCH_THREADS=$t timeout 200 ./run.sh benches/tar > $o/tar.log 2>&1); echo "chunk $c KiB, read ahead $a, threads $t: rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
  wait
  rm -rf $o/tar-shards $o/jpegs
  grep -E "^HTTP ceiling, every|^\| 8 \|" $o/tar.log | cut -c1-330; cat $o/threads.md
done
cat $R/device.txt
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
