#!/usr/bin/env bash
# make demo: from a fresh machine to a trained checkpoint. Setup and build come from the Makefile.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
bash scripts/prepare_corpus.sh
echo "[demo] training a small siamese_depth model on the embedded corpus (reproduce/demo.toml)"
resume=""
[ -d runs/demo/checkpoints ] && resume="--resume"  # a second `make demo` finishes (or keeps) the same run
build/archspace train --config reproduce/demo.toml $resume
final=$(cat runs/demo/checkpoints/final)
cat <<EOT

[demo] done. Checkpoint: runs/demo/checkpoints/$final (model/ is a Hugging Face model directory)
Next:
  build/archspace info runs/demo/checkpoints/$final/model
  build/archspace plot runs/demo --out runs/demo/loss.png            # the loss curves
  build/archspace export-hf runs/demo runs/demo-hf                    # for transformers (trust_remote_code=True)
  build/archspace generate --model runs/demo/checkpoints/$final/model --prompt "The Python"  # the checkpoint carries its tokenizer
  build/archspace train --config reproduce/tiny/stage1.toml           # the tiny four-stage pipeline, base variant
  build/archspace train --config reproduce/tiny/stage1.toml --set model.variant=siamese_depth  # the same stage, the variant
EOT
