#!/bin/bash
# Prepare what benchmarks/gpu/check.sh carries to a GPU machine in its calls a, b and c (run HERE, once per checkout).
# The device tool carries at most 64 MiB per call and its image lacks some of our packages and the embedded model, so:
#   .gpu-a/  wheels of the packages the image lacks or holds at another version + the first third of the SmolLM2 GGUF
#   .gpu-b/  its second third
#   .gpu-c/  its last third and the whole file's sha256
# Each folder is listed in .git/info/exclude (ignored: it travels only when a call names it in `carry`).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
for d in .gpu-a .gpu-b .gpu-c; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
rm -rf .gpu-a .gpu-b .gpu-c
mkdir -p .gpu-a/whl .gpu-b .gpu-c
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu-a/whl \
  gymnasium==1.0.0 pettingzoo==1.27.0 farama-notifications==0.0.4 gguf==0.19.0 transformers==5.24.0 peft==0.21.2
py=.venv/bin/python; [ -x "$py" ] || py=python3
gguf=$("$py" -c "from orchestra.backends.models import resolve_model; print(resolve_model('smollm2').path)")
split -n 3 -d "$gguf" /tmp/smollm2.part-
mv /tmp/smollm2.part-00 .gpu-a/; mv /tmp/smollm2.part-01 .gpu-b/; mv /tmp/smollm2.part-02 .gpu-c/
sha256sum "$gguf" | cut -d' ' -f1 > .gpu-c/smollm2.sha256
du -sh .gpu-a .gpu-b .gpu-c
