#!/usr/bin/env bash
# The GPU side by side, as run on a lent GPU machine (one call, about 8 minutes):
# training against nanoGPT (its own GPU configuration) and decoding against transformers.
#   NANOGPT=path/to/nanoGPT OUT=results bash benchmarks/gpu.sh
# The austen corpus must be in the cache ($GLASSFORMER_CACHE) already on a machine without
# network. Figures land in $OUT (text and JSON).
set -u
export PYTHONPATH="$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
step() {  # step NAME SECONDS COMMAND...: run one part; a failure does not stop the others
    local name=$1 seconds=$2; shift 2
    echo "=== $name"
    timeout "$seconds" "$@" 2>&1 | tee "$OUT/$name.txt" | grep -v Warning | tail -40
}
step smoke-train 180 $PY -m glassformer train lm --corpus austen --max-steps 30 --device cuda \
    --bf16 on --compile --d-model 384 --num-heads 6 --num-layers 6 --block-size 256 \
    --batch-size 64 --out /tmp/gpu-smoke --no-test --eval-every 0
step decode-smollm2 240 $PY benchmarks/generate.py --device cuda --shape smollm2 --compile \
    --repeats 3 --new-tokens 128 --batch-sizes 1,8 --json "$OUT/decode-smollm2.json"
step decode-gpt 120 $PY benchmarks/generate.py --device cuda --compile --repeats 3 \
    --json "$OUT/decode-gpt.json"
step train-nanogpt "${TRAIN_SECONDS:-420}" $PY benchmarks/nanogpt_lm.py --nanogpt "$NANOGPT" \
    --device cuda --minutes "${MINUTES:-1.5}" --work /tmp/gpu-nanogpt
cp /tmp/gpu-nanogpt/result.json "$OUT/train.json" 2>/dev/null
