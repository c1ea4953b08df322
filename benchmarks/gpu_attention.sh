#!/usr/bin/env bash
# The fused attention kernels on a GPU machine, one command (results and
# logs under $OUT, default ./gpu-out): the Triton kernels against autograd
# and the engine against stock PyG on the GPU (tests), the kernel launch
# sweep (fused_attention.py) and the attention section of the device check.
# Each step is time-boxed and independent of the others; STEPS picks some.
OUT=${OUT:-gpu-out}
STEPS=${STEPS:-tests kernels attention}
mkdir -p "$OUT/results"
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
if ls .whl/*.whl >/dev/null 2>&1; then
  pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
python -c 'import pytest' 2>/dev/null || \
  pip install -q --no-index --no-deps --target /tmp/site .whl/pytest/*.whl
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python -c 'import torch, triton, torch_geometric as g; print(torch.__version__, triton.__version__, g.__version__)'
step() {  # step SECONDS NAME COMMAND...
  local limit=$1 name=$2; shift 2
  case " $STEPS " in *" $name "*) ;; *) return ;; esac
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "[$name] exit $? after $((SECONDS - start)) s"; tail -n 25 "$OUT/$name.log"
}
step 170 tests python -m pytest -q -rfEs -p no:cacheprovider \
  tests/nn/engine/test_fused_kernels.py tests/nn/engine/test_fused_attention.py \
  -k 'cuda'
step 120 kernels python benchmarks/fused_attention.py --device cuda \
  --rows 1000000 --repeat 3 --out "$OUT/results"
step 250 attention python benchmarks/device_check.py --sections attention \
  --keep benchmarks/results/device_check.json --budget-s 210 \
  --out "$OUT/results"
