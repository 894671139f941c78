#include "archspace/util/cpu_isa.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "archspace/util/error.h"

namespace archspace {

const char* cpu_isa_name(CpuIsa isa) { return isa == CpuIsa::kAvx2 ? "avx2" : "scalar"; }

CpuIsa detected_cpu_isa() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2 ? CpuIsa::kAvx2 : CpuIsa::kScalar;
#else
  return CpuIsa::kScalar;
#endif
}

namespace {
CpuIsa capped_isa() {
  const CpuIsa detected = detected_cpu_isa();
  const char* env = std::getenv("ARCHSPACE_MAX_CPU_ISA");
  if (!env || !*env) return detected;
  const std::string cap = env;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2})
    if (cap == cpu_isa_name(isa)) return std::min(detected, isa);
  throw Error("ARCHSPACE_MAX_CPU_ISA='" + cap + "' is not one of: scalar, avx2");
}
}  // namespace

CpuIsa max_cpu_isa() {
  static const CpuIsa isa = capped_isa();
  return isa;
}

}  // namespace archspace
