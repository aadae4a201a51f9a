#!/usr/bin/env bash
# Tar shards over HTTP, fields only: chunk size, read-ahead and runtime threads swept.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/g7.tar.xz -C /tmp; cd /tmp/g7
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_OUT=$R/bench; mkdir -p $R/bench
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
for v in "4096 4 4" "4096 8 4" "4096 16 8" "2048 16 4" "2048 16 8" "1024 32 8" "1024 16 4" "8192 8 8"; do
  set -- $v
  for pass in 1 2; do
    echo "== chunk $1 KiB, read-ahead $2, threads $3 (pass $pass)" >> $R/sweep.log
    PINNABLE_BENCH_CHUNK_KIB=$1 PINNABLE_BENCH_READ_AHEAD=$2 PINNABLE_BENCH_THREADS=$3 PINNABLE_BENCH_DECODE=0 PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_WORKERS=8,14 timeout 40 ./run.sh benches/tar 2>&1 | grep -E "plain .GET.s of whole shards, 16|\*\*ours over HTTP|stream alone" >> $R/sweep.log
  done
done
rm -rf $R/bench
cat $R/device.txt $R/sweep.log
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
