#!/usr/bin/env bash
# The embedded default corpus: the reStructuredText sources of the Python 3.11 documentation, from
# Debian's python3.11-doc package (scripts/setup.sh installs it; PSF License Version 2, see
# /usr/share/doc/python3.11-doc/copyright). About 11 MB of real English prose and examples, 500 files.
# Tokenized with the OLMo 3 tokenizer into data/corpus/train and data/corpus/valid: every 20th file
# (in sorted order) is validation, so the split is fixed and reproducible. Idempotent.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=${ARCHSPACE_CORPUS_SOURCE:-/usr/share/doc/python3.11/html/_sources}
out=${1:-$repo/data/corpus}
bin=$repo/build/archspace

if [ -f "$out/train/manifest.json" ] && [ -f "$out/valid/manifest.json" ]; then
  echo "[corpus] present: $out/train, $out/valid"
  exit 0
fi
[ -d "$src" ] || { echo "[corpus] $src is missing: run scripts/setup.sh (Debian package python3.11-doc)" >&2; exit 1; }
mapfile -t files < <(find "$src" -type f -name '*.txt' | LC_ALL=C sort)
train=(); valid=()
for i in "${!files[@]}"; do
  if (( i % 20 == 10 )); then valid+=("${files[$i]}"); else train+=("${files[$i]}"); fi
done
echo "[corpus] ${#files[@]} files from $src: ${#train[@]} train, ${#valid[@]} validation"
rm -rf "$out/train" "$out/valid"
"$bin" tokenize --tokenizer dolma2 --out "$out/train" "${train[@]}"
"$bin" tokenize --tokenizer dolma2 --out "$out/valid" "${valid[@]}"
echo "[corpus] ready: $out/train, $out/valid"
