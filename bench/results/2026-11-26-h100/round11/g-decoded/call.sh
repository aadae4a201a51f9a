#!/usr/bin/env bash
# Round 11: the decoded rows of benches/tar (JPEG members of local shards against ImageFolder on
# the same files, 8 and 14 workers), three runs of the bench as it lands (t11h), one instance.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; cat bundle/t11h.commit; } > $R/device.txt
tar -xJf bundle/t11h.tar.xz -C /tmp
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_BENCH_WORKERS=8,14
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
for rep in 1 2 3; do
  s=$SECONDS; o=$R/decoded-$rep; mkdir -p $o
  (cd /tmp/t11h && PINNABLE_BENCH_OUT=$o timeout 150 ./run.sh benches/tar > $o/tar.log 2>&1); echo "run $rep: rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
  rm -rf $o/tar-shards $o/jpegs
done
cat $R/device.txt
grep -hE "^\| tar shards|images decoded, (8|14)" $R/decoded-*/tar.log | cut -c1-200
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
