#!/usr/bin/env bash
# make study: a small normalization study on this CPU (docs/analysis.md "A small study"), in three steps:
#   1. topology x learning rate (reproduce/study/topologies.toml): Pre-Norm, Post-Norm, HybridNorm and
#      SiameseNorm at three learning rates (3e-4, 3e-3, 3e-2), matched data and seed; gradient norms, spikes and
#      divergence recorded;
#   2. base against siamese_depth at matched tokens (reproduce/study/variants.toml), five seeds per arm (pairs: the
#      same seed, init and data order), judged by `archspace compare` (runs/study/seeds: intervals over the seeds);
#   3. `archspace analyze` of both step-2 models of seed 0: stream norms, layer pruning, logit lens (analysis.png);
# then the figures (scripts/plot_study.py: topologies.png, variants.png) and the tables (summary.md,
# scripts/study_table.py) that docs/analysis.md "A small study" shows.
# Everything lands in runs/study/ (not configurable: the TOMLs name it). Resumable: rerunning skips what is done.
# Takes about 33 minutes on two idle cores (docs/analysis.md "A small study").
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

# The data: the embedded corpus cut to a 4,096-id vocabulary (scripts/study_vocab.py says why).
if [ ! -f "$out/corpus/vocab.json" ]; then
  .venv/bin/python scripts/study_vocab.py data/corpus/train data/corpus/valid "$out/corpus" --vocab 4096
fi

# The model: 12 layers ([sliding x3, full] x3) of width 128 (8 heads over 4 kv heads), once per variant.
for variant in base siamese_depth; do
  config=$out/config-$variant.json
  [ -f "$config" ] && continue
  tmp=$(mktemp -d)
  "$bin" init --preset micro --variant "$variant" --out "$tmp/model" > /dev/null
  .venv/bin/python - "$tmp/model/config.json" "$out/corpus/vocab.json" "$config" <<'PY'
import json, sys
c, vocab = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
c.update(num_hidden_layers=12, layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 3,
         hidden_size=128, intermediate_size=384, num_attention_heads=8, num_key_value_heads=4,
         vocab_size=vocab["vocab_size"], padded_vocab_size=vocab["vocab_size"], eos_token_id=vocab["eos_id"],
         pad_token_id=vocab["other_id"])
json.dump(c, open(sys.argv[3], "w"), indent=2)
PY
  rm -rf "$tmp"
  say "model config: $config"
done

say "1/3 topology x learning rate"
"$bin" sweep --config reproduce/study/topologies.toml \
  --grid model.norm_topology=pre,post,hybrid,siamese_hybrid_pre --grid optim.lr=3e-4,3e-3,3e-2

say "2/3 base against siamese_depth at matched tokens, seeds 0-4 of each"
"$bin" sweep --config reproduce/study/variants.toml --grid model.variant=base,siamese_depth --grid train.seed=0,1,2,3,4
seeds=(0 1 2 3 4)
"$bin" compare --a "${seeds[@]/#/$out/variants/variant=base,seed=}" \
  --b "${seeds[@]/#/$out/variants/variant=siamese_depth,seed=}" --out "$out/seeds" > /dev/null
say "the seeded comparison: $out/seeds/compare.md"

say "3/3 analysis of both models (held-out corpus)"
for variant in base siamese_depth; do
  "$bin" analyze "$out/variants/variant=$variant,seed=0" --data $out/corpus/valid --sequences 16 --sequence-length 128 \
    --out "$out/analysis-$variant"
done
.venv/bin/python scripts/plot_analysis.py "$out/analysis-base/analysis.json" "$out/analysis-siamese_depth/analysis.json" \
  --labels base,siamese_depth --out "$out/analysis.png"
.venv/bin/python scripts/plot_study.py "$out"
.venv/bin/python scripts/study_table.py "$out" | tee "$out/summary.md"
say "done: $out/summary.md, topologies.png, variants.png, analysis.png, seeds/convergence.png (and each sweep's sweep.png)"
