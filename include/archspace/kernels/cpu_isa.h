// Which instruction set the engine's own CPU kernels (everything in kernels/) may use: the best this CPU has,
// capped by ARCHSPACE_MAX_CPU_ISA, as oneDNN's ONEDNN_MAX_CPU_ISA and ATen's ATEN_CPU_CAPABILITY cap theirs.
// The cap exists so that a test run can force the other code paths on one machine (scripts/kernel_paths.sh)
// and show that results do not depend on which kernel runs.
//
// The one dispatch rule of the module: a kernel takes `CpuIsa isa = max_cpu_isa()` (tests pass each path this
// machine has, tests/unit/test_support.h) and runs its best path at or below kernel_isa(isa).
#pragma once

namespace archspace {

// kAvx2: AVX2 with FMA. kAvx512Bf16: AVX512F, AVX512BW and AVX512-BF16 besides (the bf16 GEMV's dot-product
// instruction); the fp32 GEMV uses AVX512F there too (a CPU with AVX512F but not BF16 runs the AVX2 kernels).
enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvx512Bf16 = 2 };

const char* cpu_isa_name(CpuIsa isa);  // "scalar", "avx2", "avx512_bf16"

// What this CPU supports (cpuid), before the cap.
CpuIsa detected_cpu_isa();

// Whether this CPU has AMX with its bf16 tile multiply (cpuid leaf 7: Intel since Sapphire Rapids), where MKL's
// bf16 GEMMs run on the tiles (kernels/bf16_gemm.h). Not an instruction set of the engine's own kernels.
bool cpu_has_amx_bf16();

// min(detected, ARCHSPACE_MAX_CPU_ISA), read once. Throws archspace::Error naming the variable and the valid
// values when it is set to anything else.
CpuIsa max_cpu_isa();

// The path a kernel asked for `requested` runs: min(requested, detected_cpu_isa()), so that a test asking for a
// path this CPU lacks runs the best one it has.
CpuIsa kernel_isa(CpuIsa requested = max_cpu_isa());

// Whether oneDNN may run its native bf16 GEMMs (from AVX512_CORE_BF16 up): not when ONEDNN_MAX_CPU_ISA (or its old
// name DNNL_MAX_CPU_ISA) caps it below that, as scripts/kernel_paths.sh avx2 does (ATen then takes its slow
// fallback; kernels/bf16_matmuls.h widens instead). Read here, with the other caps, on each call.
bool onednn_allows_native_bf16();

}  // namespace archspace
