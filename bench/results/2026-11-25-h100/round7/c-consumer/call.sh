#!/usr/bin/env bash
# Device decode: where the time goes (the batcher alone, the loader without a consumer, nsys).
set -u
root=$PWD
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib
{ date -u; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader; nproc; } > $R/device.txt
tar -xJf bundle/d1.tar.xz -C /tmp; cd /tmp/d1
export PINNABLE_BENCH_DATA=/tmp PINNABLE_BENCH_OUT=$R/bench; mkdir -p $R/bench
timeout 60 python3 $root/bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
s=$SECONDS; timeout 100 ./run.sh tests/images_gpu > $R/tests.log 2>&1; echo "images_gpu rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; timeout 110 python3 $root/bench/torch_images.py --dir /tmp/jpegs --out $R/bench/torch_images.txt --gpu-decode-only > $R/images_twin.log 2>&1; echo "images twin rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; PINNABLE_BENCH_ONLY=device PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs timeout 150 ./run.sh benches/images > $R/images.log 2>&1; echo "images bench rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${nsys:-none}" >> $R/device.txt
if [ -n "$nsys" ]; then
  s=$SECONDS; PINNABLE_BENCH_ONLY=device PINNABLE_BENCH_BATCHES=40 PINNABLE_BENCH_IMAGES_DIR=/tmp/jpegs PINNABLE_REQUIRE_GPU=1 timeout 200 $nsys profile -o /tmp/prof -t cuda,osrt --force-overwrite true ./benches/images > $R/nsys-run.log 2>&1; echo "nsys rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
  timeout 100 $nsys stats -r cuda_gpu_kern_sum,cuda_api_sum,osrt_sum,cuda_gpu_mem_time_sum -f csv -o /tmp/stats /tmp/prof.nsys-rep > /dev/null 2>&1; cp /tmp/stats* $R/ 2>/dev/null
fi
rm -rf $R/bench/jpegs
cat $R/device.txt; grep -E "test result|FAILED|panicked" $R/tests.log | head; grep -E "^\| (u8|f32)|tv_gpu_decode_best|tv_gpu_pipeline_best|^- " $R/images.log | head -30
tar -czf $OUT/x.tgz -C $OUT r && rm -rf $OUT/r
