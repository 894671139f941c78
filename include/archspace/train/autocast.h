// bf16 autocast for one scope (the forward pass), as torch.autocast("cuda", dtype=torch.bfloat16) in a
// `with` block: weights stay fp32, matmuls run in bf16. Leaving the scope restores the previous state and
// drops the bf16 copies of the weights made inside it, so no pairing of enable/disable calls can go wrong.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace archspace {

class AutocastGuard {
 public:
  // enabled=false: does nothing (fp32 training).
  explicit AutocastGuard(bool enabled, c10::DeviceType device = c10::kCUDA, c10::ScalarType dtype = c10::kBFloat16);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_;
  c10::DeviceType device_;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::kBFloat16;
};

}  // namespace archspace
