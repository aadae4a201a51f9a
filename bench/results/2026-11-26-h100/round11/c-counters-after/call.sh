#!/usr/bin/env bash
# Round 11: where the remote stream's takes wait with a lock per chunk (experiment build t11m:
# 8375e3f with counters, t11m.patch); chunk KiB : read ahead : runtime threads : workers : cap MiB.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/t11m.tar.xz -C /tmp
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_DECODE=0 PINNABLE_BENCH_REPEAT=200 PINNABLE_BENCH_WINDOW=4000
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
for cfg in 2048:16:8:8:256 2048:16:8:14:256 4096:8:12:8:256 2048:32:12:14:256 2048:16:8:8:1024 2048:16:12:14:1024 1024:32:8:8:256; do
  IFS=: read c a t w m <<< "$cfg"
  s=$SECONDS; o=$R/t11m-c$c-a$a-t$t-w$w-m$m; mkdir -p $o
  (cd /tmp/t11m && PINNABLE_BENCH_CACHE_MIB=$m PINNABLE_BENCH_WORKERS=$w PINNABLE_BENCH_OUT=$o PINNABLE_BENCH_CHUNK_KIB=$c PINNABLE_BENCH_READ_AHEAD=$a PINNABLE_BENCH_THREADS=$t timeout 100 ./run.sh benches/tar > $o/tar.log 2>&1); echo "chunk $c KiB, read ahead $a, threads $t, workers $w, cap $m MiB: rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
  rm -rf $o/tar-shards $o/jpegs
done
cat $R/device.txt
for o in $R/t11*; do echo "== $(basename $o) $(grep -E '^\| (8|14) \|' $o/tar.log | cut -d'|' -f3-5,8,9 | tr -s ' ')"; grep -E "^STATS takes [1-9]" $o/tar.log | cut -c1-520; grep -E "fields only, (8|14) workers\*\*" $o/tar.log | cut -d'|' -f7; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
