#!/usr/bin/env bash
# Round 11: whether batches made further ahead free the workers over HTTP (a worker preempted
# on a shared machine holds up the batches after its own); benches/tar (t11g) section 4, the
# steady window, chunk 2048 KiB, 16 read ahead, 8 runtime threads; prefetch : workers.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; cat bundle/t11g.commit; } > $R/device.txt
tar -xJf bundle/t11g.tar.xz -C /tmp
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_DECODE=0 PINNABLE_BENCH_REPEAT=200 PINNABLE_BENCH_WINDOW=4000 PINNABLE_BENCH_CHUNK_KIB=2048 PINNABLE_BENCH_READ_AHEAD=16 PINNABLE_BENCH_THREADS=8
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
for rep in 1 2; do
for cfg in 2:8 8:8 24:8 2:14 8:14 24:14; do
  IFS=: read p w <<< "$cfg"
  s=$SECONDS; o=$R/t11g-p$p-w$w-$rep; mkdir -p $o
  (cd /tmp/t11g && PINNABLE_BENCH_PREFETCH=$p PINNABLE_BENCH_WORKERS=$w PINNABLE_BENCH_OUT=$o timeout 100 ./run.sh benches/tar > $o/tar.log 2>&1); echo "prefetch $p, workers $w, repeat $rep: rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
  rm -rf $o/tar-shards $o/jpegs
done
done
cat $R/device.txt
for o in $R/t11*; do echo "== $(basename $o) $(grep -E '^\| (8|14) \|' $o/tar.log | cut -d'|' -f3-5,8-12 | tr -s ' ')"; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
