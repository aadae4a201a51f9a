#!/usr/bin/env bash
# Round 11: the remote stream with a lock per chunk (t11n, 8375e3f) against one lock over the run
# (t11o, 7b2632e), interleaved on one instance, twice each; both with the bench's window and
# repeat knobs (round10/b-thread-waits/experiment.patch); chunk KiB : read ahead : runtime
# threads : workers; steady window of 4000 batches in an epoch of the shards listed 200 times.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/t11o.tar.xz -C /tmp; tar -xJf bundle/t11n.tar.xz -C /tmp
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_DECODE=0 PINNABLE_BENCH_REPEAT=200 PINNABLE_BENCH_WINDOW=4000
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
for rep in 1 2; do
for cfg in 4096:4:4:8 2048:16:8:8 4096:8:12:8 2048:16:8:14; do
for b in t11o t11n; do
  IFS=: read c a t w <<< "$cfg"
  s=$SECONDS; o=$R/$b-c$c-a$a-t$t-w$w-$rep; mkdir -p $o
  (cd /tmp/$b && PINNABLE_BENCH_WORKERS=$w PINNABLE_BENCH_OUT=$o PINNABLE_BENCH_CHUNK_KIB=$c PINNABLE_BENCH_READ_AHEAD=$a PINNABLE_BENCH_THREADS=$t timeout 100 ./run.sh benches/tar > $o/tar.log 2>&1); echo "$b chunk $c KiB, read ahead $a, threads $t, workers $w, repeat $rep: rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
  rm -rf $o/tar-shards $o/jpegs
done
done
done
cat $R/device.txt
for o in $R/t11*; do echo "== $(basename $o) $(grep -E '^\| (8|14) \|' $o/tar.log | cut -d'|' -f3-5,8,9 | tr -s ' ')"; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
