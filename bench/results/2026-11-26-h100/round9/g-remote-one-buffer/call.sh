#!/usr/bin/env bash
# Round 9: remote shards, each chunk landing in one buffer its samples share (one allocation
# a chunk, not a sample); chunk KiB : read ahead : runtime threads : cache MiB.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/t9c.tar.xz -C /tmp; cd /tmp/t9c
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_DECODE=0 PINNABLE_BENCH_WORKERS=8,14
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
for cfg in 4096:4:4:256 2048:16:8:256 4096:8:8:256 1024:32:8:256 4096:4:4:256 2048:16:8:256 4096:8:8:256 1024:32:8:256 2048:16:16:256; do
  IFS=: read c a t m <<< "$cfg"
  s=$SECONDS; o=$R/c$c-a$a-t$t-m$m-$s; mkdir -p $o
  PINNABLE_BENCH_OUT=$o PINNABLE_BENCH_CHUNK_KIB=$c PINNABLE_BENCH_READ_AHEAD=$a PINNABLE_BENCH_THREADS=$t PINNABLE_BENCH_CACHE_MIB=$m timeout 150 ./run.sh benches/tar > $o/tar.log 2>&1; echo "chunk $c KiB, read ahead $a, threads $t, cache $m MiB: rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
  rm -rf $o/tar-shards $o/jpegs
done
cat $R/device.txt
for o in $R/c*; do echo "== $o"; grep -E "^HTTP ceiling, every|^\| (8|14) \||ours over HTTP, fields only" $o/tar.log; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
