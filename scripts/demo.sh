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
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
cat <<EOT

[demo] done. Checkpoint: runs/demo/checkpoints/$final (model/ is a Hugging Face model directory)
Next: the five-minute tour of README.md, on this model (run from $repo; each block as it is there):

EOT
"$py" scripts/readme_tour.py  # the README's tour blocks, as tests/python/test_readme_tour.py runs them
echo
echo "More: README.md and docs/ (training: docs/training.md; the tiny four-stage pipeline: reproduce/tiny/)."
