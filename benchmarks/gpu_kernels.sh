#!/usr/bin/env bash
# Kernel correctness + speed on a CUDA machine, in one go (< 5 min):
#   bash benchmarks/gpu_kernels.sh            -> $OUT/kernels_gpu.md (or benchmarks/results/kernels_gpu.md)
# Installs nothing but this tree (pip install -e . --no-deps, only if vlserve.kernels does not import).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"

if ! "$PYTHON" -c "import vlserve.kernels" >/dev/null 2>&1; then
    "$PYTHON" -m pip install --no-deps --no-build-isolation -q -e .
fi
"$PYTHON" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'triton', triton.__version__)"

OUT_DIR="${OUT:-benchmarks/results}"
mkdir -p "$OUT_DIR"
exec "$PYTHON" benchmarks/kernels.py --out "$OUT_DIR/kernels_gpu.md" "$@"
