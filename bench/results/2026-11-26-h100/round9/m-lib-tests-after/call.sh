#!/usr/bin/env bash
# Round 9: the library's unit tests on the GPU after the copy-stream-holding tests were made to
# run one at a time: eight whole runs, then the GPU image, packing and token tests.
set -u
mkdir -p $OUT/r; R=$OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/r9.tar.xz -C /tmp; cd /tmp/r9
for k in 1 2 3 4 5 6 7 8; do
  s=$SECONDS; PINNABLE_REQUIRE_GPU=1 timeout 45 ./run.sh tests/pinnable-lib > $R/whole-$k.log 2>&1; echo "whole $k rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
done
for t in images_gpu packing_gpu tokens_gpu; do
  s=$SECONDS; PINNABLE_REQUIRE_GPU=1 timeout 120 ./run.sh tests/$t > $R/test-$t.log 2>&1; echo "$t rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
done
cat $R/device.txt
grep -h "running for over\|test result" $R/*.log | sort | uniq -c
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
