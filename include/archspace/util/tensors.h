// Vocabulary shared by every layer that handles tensors by name: the model's parameters, checkpoint and
// optimizer state, named activations. Lives in util so that the model need not include the file formats.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace archspace {

// Tensors in a meaningful order (checkpoint order, forward order), each with its stable name.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// "[2, 3]": shapes in error messages.
inline std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace archspace
