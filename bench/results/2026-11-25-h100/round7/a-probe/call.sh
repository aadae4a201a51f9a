#!/usr/bin/env bash
# nvJPEG's batched decode alone: backends, output formats, flags, threads (bench/nvjpeg_probe.py)
set -u
mkdir -p $OUT/r; R=$OUT/r
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
{ date -u; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader; nproc; } > $R/device.txt
timeout 60 python3 bench/torch_images.py --generate /tmp/jpegs > /dev/null 2>&1
tvlib=$(ls /opt/torch/.venv/lib/python3.12/site-packages/torchvision.libs/libnvjpeg*.so.13 2>/dev/null | head -1)
s=$SECONDS; timeout 200 python3 bench/nvjpeg_probe.py --dir /tmp/jpegs --lib /tmp/site/nvidia/cu13/lib/libnvjpeg.so.13 --out $R/probe-wheel.txt > $R/probe-wheel.log 2>&1; echo "probe wheel rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
s=$SECONDS; timeout 120 python3 bench/nvjpeg_probe.py --dir /tmp/jpegs --lib "$tvlib" --out $R/probe-tv.txt > $R/probe-tv.log 2>&1; echo "probe torchvision's lib rc=$? ($((SECONDS-s)) s)" >> $R/device.txt
cat $R/device.txt; cat $R/probe-wheel.log; echo ---; cat $R/probe-tv.log | head -20
