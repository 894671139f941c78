#include "archspace/train/autocast.h"

#include <ATen/autocast_mode.h>

namespace archspace {

AutocastGuard::AutocastGuard(bool enabled, c10::DeviceType device, c10::ScalarType dtype)
    : enabled_(enabled), device_(device) {
  if (!enabled_) return;
  previous_enabled_ = at::autocast::is_autocast_enabled(device_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_dtype(device_, dtype);
  at::autocast::set_autocast_enabled(device_, true);
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  at::autocast::set_autocast_enabled(device_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_, previous_dtype_);
  if (!previous_enabled_) at::autocast::clear_cache();  // as torch.autocast does when the outermost scope exits
}

}  // namespace archspace
