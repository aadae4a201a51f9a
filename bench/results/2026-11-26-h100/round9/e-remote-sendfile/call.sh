#!/usr/bin/env bash
# Round 9: remote shards after the test server's sendfile fix, the steady window at the
# defaults and the best settings of round 8's sweep, twice each.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/t9a.tar.xz -C /tmp; cd /tmp/t9a
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_DECODE=0 PINNABLE_BENCH_WORKERS=8,14
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
for cfg in 4096:4:4 2048:16:8 1024:32:8 4096:8:8 4096:4:4 2048:16:8 1024:32:8 4096:8:8 2048:16:16; do
  c=${cfg%%:*}; rest=${cfg#*:}; a=${rest%%:*}; t=${rest#*:}
  s=$SECONDS; o=$R/c$c-a$a-t$t-$s; mkdir -p $o
  PINNABLE_BENCH_OUT=$o PINNABLE_BENCH_CHUNK_KIB=$c PINNABLE_BENCH_READ_AHEAD=$a PINNABLE_BENCH_THREADS=$t timeout 150 ./run.sh benches/tar > $o/tar.log 2>&1; echo "chunk $c KiB, read ahead $a, threads $t: rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
  rm -rf $o/tar-shards $o/jpegs
done
cat $R/device.txt
for o in $R/c*; do echo "== $o"; grep -E "^HTTP ceiling, every|^\| (8|14) \||ours over HTTP, fields only|plain .GET.s of whole shards, 16" $o/tar.log; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
