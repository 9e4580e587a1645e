#!/bin/bash
# The device call that produced this folder's data (nvidia-h200; run from the repo root, $OUT = output folder).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/engine-replay}; mkdir -p "$OUT"
{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  python3 -c "import flash_attn; print('flash_attn', flash_attn.__version__)" 2>&1 | tail -1
  timeout 120 python3 -c "import torch; f = torch.compile(lambda x: torch.nn.functional.silu(x) * 2); print('torch.compile ok', f(torch.randn(8, device='cuda')).sum().item())" 2>&1 | tail -1
  uname -a; nproc; } > "$OUT/machine.txt" 2>&1
python3 -m hwbackend.replay.bench_engine --check --out "$OUT" > "$OUT/log.txt" 2>&1
python3 -m hwbackend.replay.bench_engine --compute engine --out "$OUT" >> "$OUT/log.txt" 2>&1
python3 -m hwbackend.replay.bench_engine --compute harness --out "$OUT" >> "$OUT/log.txt" 2>&1
python3 -m pytest -q -p no:cacheprovider tests/test_hw_replay_engine.py -k cuda > "$OUT/pytest.log" 2>&1
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu --format=csv >> "$OUT/machine.txt" 2>&1
tail -5 "$OUT/log.txt"; cat "$OUT/check.json"; tail -3 "$OUT/pytest.log"
