#!/usr/bin/env bash
# Round 11: benches/tar as it lands (t11h, the fields-only loaders 8 batches ahead), section 4's steady window (the shards listed 200
# times, a window of 4000 batches), twice each; chunk KiB : read ahead : runtime threads :
# workers (4096:2:2 is the library's defaults, 4096:4:4 the bench's).
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; cat bundle/t11h.commit; } > $R/device.txt
tar -xJf bundle/t11h.tar.xz -C /tmp
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_DECODE=0 PINNABLE_BENCH_REPEAT=200 PINNABLE_BENCH_WINDOW=4000
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
for rep in 1 2; do
for cfg in 4096:2:2:8 4096:4:4:8 2048:16:8:8 2048:16:8:14; do
  IFS=: read c a t w <<< "$cfg"
  s=$SECONDS; o=$R/t11h-c$c-a$a-t$t-w$w-$rep; mkdir -p $o
  (cd /tmp/t11h && PINNABLE_BENCH_WORKERS=$w PINNABLE_BENCH_OUT=$o PINNABLE_BENCH_CHUNK_KIB=$c PINNABLE_BENCH_READ_AHEAD=$a PINNABLE_BENCH_THREADS=$t timeout 100 ./run.sh benches/tar > $o/tar.log 2>&1); echo "chunk $c KiB, read ahead $a, threads $t, workers $w, repeat $rep: rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
  rm -rf $o/tar-shards $o/jpegs
done
done
s=$SECONDS; o=$R/t11h-decoded; mkdir -p $o
(cd /tmp/t11h && PINNABLE_BENCH_DECODE=1 PINNABLE_BENCH_REPEAT=40 PINNABLE_BENCH_WINDOW=1024 PINNABLE_BENCH_WORKERS=8,14 PINNABLE_BENCH_OUT=$o PINNABLE_BENCH_CHUNK_KIB=2048 PINNABLE_BENCH_READ_AHEAD=16 PINNABLE_BENCH_THREADS=8 timeout 200 ./run.sh benches/tar > $o/tar.log 2>&1); echo "decoded rows too (2048:16:8, 8 and 14 workers): rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
rm -rf $o/tar-shards $o/jpegs
cat $R/device.txt
grep -E "^\| " $R/t11h-decoded/tar.log | cut -c1-260
for o in $R/t11*; do echo "== $(basename $o) $(grep -E '^\| (8|14) \|' $o/tar.log | cut -d'|' -f3-5,8-12 | tr -s ' ')"; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
