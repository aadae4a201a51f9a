#!/usr/bin/env bash
# Round 11, the code as it lands (after the review and the stream's property test): every bundled test and example (PINNABLE_REQUIRE_GPU=1);
# the device decoder's table beside torchvision's twin; its u8 rows again; a hang check (4 and 8
# workers, one and two threads in the engines, a host share); then benches/tar at its defaults.
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site PINNABLE_REQUIRE_GPU=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader; nproc; cat bundle/g11z.commit; } > $R/device.txt
tar -xJf bundle/g11z.tar.xz -C /tmp; cd /tmp/g11z
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs; mkdir -p $R/bench
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
s=$SECONDS; timeout 240 ./run.sh tests > $R/tests.log 2>&1; echo "tests rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; timeout 120 ./run.sh examples > $R/examples.log 2>&1; echo "examples rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
export PINNABLE_BENCH_OUT=$R/bench
s=$SECONDS; timeout 90 python3 $root/bench/torch_images.py --dir /tmp/jpegs --out $R/bench/torch_images.txt --gpu-decode-only > $R/images_twin.log 2>&1; echo "images twin rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; PINNABLE_BENCH_ONLY=device timeout 150 ./run.sh benches/images > $R/images.log 2>&1; echo "images bench rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=1,2,3,4,2:0:2,1,2,3,4,2:0:2 timeout 90 ./run.sh benches/images > $R/images_quick.log 2>&1; echo "images quick rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
for w in 4 8 4:0:2 8:0:2 8:0.06:2; do
  s=$SECONDS; PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=$w timeout 20 ./run.sh benches/images > $R/hang.log 2>&1
  echo "hang check $w workers: rc=$? ($((SECONDS-s)) s) $(grep -E '^\| u8' $R/hang.log | cut -d'|' -f4,5,7,8,12)" >> $R/hang.txt
done
mkdir -p $R/tar; s=$SECONDS; PINNABLE_BENCH_OUT=$R/tar PINNABLE_BENCH_DECODE=0 PINNABLE_BENCH_WORKERS=8 PINNABLE_BENCH_CHUNK_KIB=2048 PINNABLE_BENCH_READ_AHEAD=16 PINNABLE_BENCH_THREADS=8 PINNABLE_BENCH_REPEAT=200 PINNABLE_BENCH_WINDOW=4000 timeout 120 ./run.sh benches/tar > $R/tar/tar.log 2>&1; echo "tar bench rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
rm -rf $R/bench/jpegs $R/hang.log $R/tar/tar-shards $R/tar/jpegs
cat $R/device.txt $R/hang.txt
grep -E "^test result|FAILED|panicked|skipped" $R/tests.log | sort | uniq -c | sort -rn | head -8
grep -E "FAILED|panicked|error" $R/examples.log | head -5
grep -E "tv_gpu_decode_best|tv_gpu_pipeline_best" $R/bench/torch_images.txt
grep -E "^\| (u8|f32)" $R/images.log $R/images_quick.log | cut -d'|' -f2-12
grep -E "ours over HTTP|^\| 8 \|" $R/tar/tar.log | cut -c1-400
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
