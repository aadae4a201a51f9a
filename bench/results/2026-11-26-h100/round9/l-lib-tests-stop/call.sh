#!/usr/bin/env bash
# Round 9: the library's unit tests on the GPU, which stopped once (two fault-injection tests
# holding the copy stream ran past 150 s): run whole three times, one test at a time once, and
# three times without the test that synchronises the whole context (Device::empty_cache).
set -u
mkdir -p $OUT/r; R=$OUT/r
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/r9.tar.xz -C /tmp; cd /tmp/r9
for k in 1 2 3; do
  s=$SECONDS; PINNABLE_REQUIRE_GPU=1 timeout 60 ./run.sh tests/pinnable-lib > $R/whole-$k.log 2>&1; echo "whole $k rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
done
s=$SECONDS; PINNABLE_REQUIRE_GPU=1 timeout 120 ./run.sh tests/pinnable-lib --test-threads=1 > $R/serial.log 2>&1; echo "one at a time rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
for k in 1 2 3; do
  s=$SECONDS; PINNABLE_REQUIRE_GPU=1 timeout 60 ./run.sh tests/pinnable-lib --skip a_thread_s_decoding_state > $R/skip-$k.log 2>&1; echo "without the empty_cache test $k rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
done
cat $R/device.txt
grep -h "running for over\|test result" $R/*.log
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
