#!/usr/bin/env bash
# make study: a small normalization study on this CPU (README "A small study"), in three steps:
#   1. topology x learning rate (reproduce/study/topologies.toml): Pre-Norm, Post-Norm, HybridNorm and
#      SiameseNorm at a moderate and a high learning rate, matched data and seed; spikes and divergence recorded;
#   2. base against siamese_depth at matched tokens (reproduce/study/variants.toml);
#   3. `archspace analyze` of both step-2 models: stream norms, layer pruning, logit lens (analysis.png).
# Everything lands in runs/study/ (STUDY_DIR is not configurable: the TOMLs name it). Resumable: rerunning
# skips what is done. Takes about ten minutes on two idle cores.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
bin=${ARCHSPACE_BIN:-build/archspace}
out=runs/study
say() { printf '[study] %s\n' "$*"; }

grep -m1 -o -E 'avx512_bf16|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ' | sed 's/^/[study] CPU flags: /'; echo
say "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
bash scripts/prepare_corpus.sh
mkdir -p "$out"

# The model: micro's width at 12 layers ([sliding x3, full] x3), once per variant.
for variant in base siamese_depth; do
  config=$out/config-$variant.json
  [ -f "$config" ] && continue
  tmp=$(mktemp -d)
  "$bin" init --preset micro --variant "$variant" --out "$tmp/model" > /dev/null
  .venv/bin/python - "$tmp/model/config.json" "$config" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["num_hidden_layers"] = 12
c["layer_types"] = (["sliding_attention"] * 3 + ["full_attention"]) * 3
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
  rm -rf "$tmp"
  say "model config: $config"
done

say "1/3 topology x learning rate"
"$bin" sweep --config reproduce/study/topologies.toml \
  --grid model.norm_topology=pre,post,hybrid,siamese_hybrid_pre --grid optim.lr=3e-3,3e-2
"$bin" plot $out/topologies/*/ --out $out/topologies/curves.png > /dev/null

say "2/3 base against siamese_depth at matched tokens"
"$bin" sweep --config reproduce/study/variants.toml --grid model.variant=base,siamese_depth

say "3/3 analysis of both models (held-out corpus)"
for variant in base siamese_depth; do
  "$bin" analyze "$out/variants/variant=$variant" --data data/corpus/valid --sequences 8 --sequence-length 128 \
    --out "$out/analysis-$variant"
done
say "done: $out/topologies/sweep.json, sweep.png, curves.png; $out/variants/sweep.json, sweep.png; $out/analysis-*/"
