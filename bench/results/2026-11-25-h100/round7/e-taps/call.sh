#!/usr/bin/env bash
# Device decode: taps shared in a batch, planar output; where the workers wait (stack samples).
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib
{ date -u; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader; nproc; which gdb perf eu-stack pstack 2>&1; } > $R/device.txt
tar -xJf bundle/d1.tar.xz -C /tmp; cd /tmp/d1
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_OUT=$R/bench; mkdir -p $R/bench
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
s=$SECONDS; timeout 100 ./run.sh tests/images_gpu > $R/tests.log 2>&1; echo "images_gpu rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; timeout 110 python3 $root/bench/torch_images.py --dir /tmp/jpegs --out $R/bench/torch_images.txt --gpu-decode-only > $R/images_twin.log 2>&1; echo "images twin rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
for pass in 1 2; do
PINNABLE_BENCH_BATCHES=200 PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=1,2,3,4 PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs timeout 60 ./run.sh benches/images 2>&1 | grep -E "^\| u8 \| quick|error" >> $R/quick.log
done
# Stack samples of 4 workers in a long window.
(PINNABLE_BENCH_BATCHES=3000 PINNABLE_BENCH_ONLY=device-quick PINNABLE_BENCH_WORKERS=4 PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs timeout 40 ./run.sh benches/images > $R/long.log 2>&1 &)
sleep 8
pid=$(pgrep -f "benches/images" | grep -v run.sh | tail -1)
echo "pid $pid" >> $R/device.txt
if command -v gdb >/dev/null && [ -n "$pid" ]; then
  for k in $(seq 1 12); do timeout 10 gdb -p $pid -batch -ex "thread apply all bt 25" >> $R/stacks.txt 2>/dev/null; sleep 0.3; done
fi
if command -v perf >/dev/null && [ -n "$pid" ]; then timeout 15 perf record -g -p $pid -o /tmp/perf.data -- sleep 4 >/dev/null 2>&1; timeout 60 perf report -i /tmp/perf.data --stdio --no-children 2>/dev/null | head -300 > $R/perf.txt; fi
sleep 1; pkill -f "benches/images" ; sleep 1
rm -rf $R/bench/jpegs
cat $R/device.txt; grep -E "test result|FAILED|panicked" $R/tests.log | head; cat $R/quick.log; grep tv_gpu_decode_best $R/bench/torch_images.txt; wc -l $R/stacks.txt $R/perf.txt 2>/dev/null
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
