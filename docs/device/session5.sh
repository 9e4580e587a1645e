#!/usr/bin/env bash
# Device call of session 5 (2026-12-02), one lent H200, from the repository root, simpy carried as a wheel in .whl/:
#   bash docs/device/session5.sh      (files under $OUT come back; committed beside this script)
# 1. the GPU tests after the sim/ reorganisation (issue 29 item 5);
# 2. pinned host <-> device copies into mapped vAttention pages, the DRAM tier's load path (issue 35 item 6);
# 3. sliding-window page traffic through the executor per decode step (issue 33 item 5);
# 4. page hand-over between two co-located tenants' KV tensors from one physical pool (issue 34 item 4).
# Each step has its own time limit so that a slow one cannot lose the others' results.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u +%FT%TZ; hostname; cat /proc/sys/kernel/random/boot_id; uname -r
  nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/machine.txt" 2>&1
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_hw_gpu.py tests/test_hw_replay.py \
    tests/test_hw_beyond.py tests/test_hw_calibrate.py tests/test_hw_tp_gpu.py tests/test_hw_tp.py tests/test_hw_emulated.py \
    tests/test_hw_replay_engine.py tests/test_tp_replay_gpu.py -rs > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc=$?"; tail -4 "$OUT/gpu-tests.log"
timeout 45 python3 -m hwbackend.beyond.host_copy_bench --out "$OUT/host_copy.json" > "$OUT/host_copy.log" 2>&1
echo "host copy rc=$?"; tail -3 "$OUT/host_copy.log"
timeout 45 python3 -m hwbackend.beyond.window_bench --out "$OUT/window.json" > "$OUT/window.log" 2>&1
echo "window rc=$?"; tail -3 "$OUT/window.log"
timeout 45 python3 -m hwbackend.calibration.colocate_handover --out "$OUT/handover.json" > "$OUT/handover.log" 2>&1
echo "handover rc=$?"; tail -3 "$OUT/handover.log"
