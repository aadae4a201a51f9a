#!/usr/bin/env bash
# Round 10: samples keep slices of the received pieces (t10a, no copy into buffers of their own)
# against the code before (t9e), interleaved on one instance; bundle : chunk KiB : read ahead :
# runtime threads.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/t9e.tar.xz -C /tmp; tar -xJf bundle/t10a.tar.xz -C /tmp
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_DECODE=0 PINNABLE_BENCH_WORKERS=8,14
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
for rep in 1 2; do
for cfg in t9e:4096:2:2 t10a:4096:2:2 t9e:2048:8:8 t10a:2048:8:8 t9e:2048:16:8 t10a:2048:16:8 t9e:2048:16:12 t10a:2048:16:12 t10a:1024:16:12 t10a:4096:8:8; do
  IFS=: read b c a t <<< "$cfg"
  s=$SECONDS; o=$R/$b-c$c-a$a-t$t-$rep; mkdir -p $o
  (cd /tmp/$b && PINNABLE_BENCH_OUT=$o PINNABLE_BENCH_CHUNK_KIB=$c PINNABLE_BENCH_READ_AHEAD=$a PINNABLE_BENCH_THREADS=$t timeout 150 ./run.sh benches/tar > $o/tar.log 2>&1); echo "$b chunk $c KiB, read ahead $a, threads $t, repeat $rep: rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
  rm -rf $o/tar-shards $o/jpegs
done
done
cat $R/device.txt
for o in $R/t*; do echo "== $o"; grep -E "^HTTP ceiling, every|^\| (8|14) \||ours over HTTP, fields only" $o/tar.log | cut -c1-330; done
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
