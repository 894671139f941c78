// Hugging Face model directories: config.json plus safetensors weights (single file or sharded).
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "archspace/config/choices.h"
#include "archspace/io/safetensors.h"
#include "archspace/model/causal_lm.h"

namespace archspace {

struct LoadOptions {
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  // NaN/Inf weights make every output NaN (generate then prints nothing): refused, naming the tensor,
  // unless a caller inspecting a broken checkpoint asks for them.
  bool allow_nonfinite = false;
  // kInt8: every matmul weight (attention, MLP, head) held as int8 with one scale per output row
  // (kernels/int8_weights.h), quantized from the file's values; the rest in `dtype`. CPU only, inference only.
  Quantization quantization = Quantization::kNone;
};

// Reads DIR/config.json. Errors name the file and the field.
ModelConfig load_model_config(const std::string& dir);

// Checks the weights' names and shapes against the model of `config` and throws one error that lists
// every missing, unexpected and mis-shaped tensor (and any tensor of a non-float dtype).
void check_weights(const ModelConfig& config, const TensorStore& store, const std::string& dir);

CausalLM load_model(const std::string& dir, const LoadOptions& options = {});

// Writes config.json and the weights (sharded above max_shard_bytes), loadable by save_pretrained's readers.
void save_model(const CausalLM& model, const std::string& dir, at::ScalarType dtype = at::kFloat,
                uint64_t max_shard_bytes = 5ull << 30);

}  // namespace archspace
