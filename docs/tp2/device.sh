#!/usr/bin/env bash
# Two-GPU run of issue 9, point 3 (kind nvidia-h200-x2), from the repository root: bash docs/tp2/device.sh
set -u
mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
pip install -q --target /tmp/site .whl/simpy-4.1.2-py3-none-any.whl >/dev/null 2>&1; export PYTHONPATH=/tmp/site
{ date -u +%FT%TZ; hostname; nvidia-smi -L; nvidia-smi topo -m; python3 -c "import torch, cuda.bindings; print(torch.__version__, torch.cuda.device_count())"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
timeout 120 python3 -m pytest -q -p no:warnings -m gpu tests/test_hw_tp_gpu.py tests/test_hw_tp.py -rs > "$OUT/pytest.log" 2>&1; tail -8 "$OUT/pytest.log"
timeout 120 python3 bench/bench_tp.py --devices 0,1 --rounds 8 --out "$OUT/tp2-two-gpus.json" > "$OUT/bench-two-gpus.log" 2>&1; echo "two gpus rc=$?"; tail -12 "$OUT/bench-two-gpus.log"
timeout 120 python3 bench/bench_tp.py --devices 0,0 --rounds 8 --out "$OUT/tp2-one-gpu.json" > "$OUT/bench-one-gpu.log" 2>&1; echo "one gpu rc=$?"; tail -12 "$OUT/bench-one-gpu.log"
