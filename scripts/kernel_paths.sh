#!/usr/bin/env bash
# Runs a command under one of the CPU kernel-path settings, so that a test run on one machine also goes
# through the kernels another CPU would dispatch to (docs/reference.md, "Every kernel path, on one machine"):
#
#   scripts/kernel_paths.sh list          the settings' names, one per line
#   scripts/kernel_paths.sh NAME CMD...   CMD with NAME's variables set (and printed on stderr)
#
#   native    nothing set: what this CPU picks (AVX512 and AMX where present; the highest path a machine has)
#   avx2      ATen's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2: softmax, reductions, SDPA's CPU flash kernel,
#             elementwise ops), MKL's AVX2 GEMMs (MKL_ENABLE_INSTRUCTIONS=AVX2), oneDNN capped at AVX2 (its
#             bf16 GEMMs without AVX512-BF16 or AMX), the engine's AVX2 GEMVs (its bf16 one widening to fp32,
#             as a Haswell-to-Zen3 machine runs)
#   baseline  ATen's scalar kernels (ATEN_CPU_CAPABILITY=default), MKL's SSE2 "compatible" code path
#             (MKL_CBWR=COMPATIBLE: other GEMM blocking), oneDNN capped at SSE4.1, the engine's GEMV off
#             (ARCHSPACE_MAX_CPU_ISA=scalar: at::linear serves decoding)
#
# MKL_ENABLE_INSTRUCTIONS caps the engine's MKL because the engine answers MKL's vendor check (kernels/cpu_isa.cpp):
# a plain LibTorch process on an AMD CPU ignores it. tests/python/test_kernel_paths.py checks that each setting
# really changes the bits of LibTorch's kernels.
set -euo pipefail

settings=(native avx2 baseline)

if [ "${1:-}" = list ]; then
  printf '%s\n' "${settings[@]}"
  exit 0
fi
if [ $# -lt 2 ]; then
  echo "usage: $0 list | $0 {$(IFS='|'; echo "${settings[*]}")} COMMAND..." >&2
  exit 2
fi

name=$1
shift
case "$name" in
  native) vars=() ;;
  avx2) vars=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 ARCHSPACE_MAX_CPU_ISA=avx2) ;;
  baseline) vars=(ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=SSE41 ARCHSPACE_MAX_CPU_ISA=scalar) ;;
  *)
    echo "error: kernel path '$name' is not one of: ${settings[*]}" >&2
    exit 2
    ;;
esac
echo "[kernel path $name] ${vars[*]:-(nothing set)}" >&2
exec env "${vars[@]}" "$@"
