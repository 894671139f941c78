#include "archspace/kernels/cpu_isa.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <string>

#include "archspace/util/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace archspace {

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512Bf16:
      return "avx512_bf16";
    case CpuIsa::kAvx2:
      return "avx2";
    default:
      return "scalar";
  }
}

CpuIsa detected_cpu_isa() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  // The bf16 kernel's masked loads need AVX512BW beside AVX512F and AVX512-BF16.
  static const bool avx512_bf16 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                  __builtin_cpu_supports("avx512bf16");
  if (avx512_bf16) return CpuIsa::kAvx512Bf16;
  return avx2 ? CpuIsa::kAvx2 : CpuIsa::kScalar;
#else
  return CpuIsa::kScalar;
#endif
}

bool cpu_has_amx_bf16() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return (edx >> 22) & 1;  // CPUID.(EAX=7,ECX=0):EDX[22] = AMX-BF16
#else
  return false;
#endif
}

namespace {
CpuIsa capped_isa() {
  const CpuIsa detected = detected_cpu_isa();
  const char* env = std::getenv("ARCHSPACE_MAX_CPU_ISA");
  if (!env || !*env) return detected;
  const std::string cap = env;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512Bf16})
    if (cap == cpu_isa_name(isa)) return std::min(detected, isa);
  throw Error("ARCHSPACE_MAX_CPU_ISA='" + cap + "' is not one of: scalar, avx2, avx512_bf16");
}
}  // namespace

CpuIsa max_cpu_isa() {
  static const CpuIsa isa = capped_isa();
  return isa;
}

CpuIsa kernel_isa(CpuIsa requested) { return std::min(requested, detected_cpu_isa()); }

// oneDNN runs bf16 GEMMs natively from AVX512_CORE_BF16 up; ONEDNN_MAX_CPU_ISA (or its old name DNNL_MAX_CPU_ISA)
// set below that (scripts/kernel_paths.sh avx2: AVX2) leaves ATen with its slow fallback.
bool onednn_allows_native_bf16() {
  const char* env = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (!env || !*env) env = std::getenv("DNNL_MAX_CPU_ISA");
  if (!env || !*env) return true;
  std::string cap = env;
  std::transform(cap.begin(), cap.end(), cap.begin(), [](unsigned char c) { return std::toupper(c); });
  constexpr std::array<const char*, 6> native = {
      "ALL", "DEFAULT", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16"};
  return std::find(native.begin(), native.end(), cap) != native.end();
}

}  // namespace archspace

// MKL (inside LibTorch, LibTorch's fp32 GEMMs) runs its AVX2 and AVX512 code paths only on CPUs whose vendor string
// says Intel: on an AMD CPU with the same instructions it falls back to a generic path (measured on a 2-core Zen 4
// EPYC: fp32 GEMM 512 x 768 x 3072 about 1.3x slower, 190M prefill at fp32 1.3x slower). MKL asks
// mkl_serv_intel_cpu_true(), which libtorch_cpu.so calls through its PLT, so this definition in the executable takes
// its place: MKL then picks its path from the CPU's feature flags alone, as on an Intel CPU with those flags, and
// MKL_ENABLE_INSTRUCTIONS caps it (scripts/kernel_paths.sh). The link exports it (CMakeLists.txt); on an Intel
// CPU nothing changes.
extern "C" __attribute__((visibility("default"), used)) int mkl_serv_intel_cpu_true() { return 1; }
