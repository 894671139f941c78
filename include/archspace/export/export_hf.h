// export-hf: a checkpoint (or run, or model directory) to a Hugging Face model directory: config.json,
// safetensors weights, the tokenizer (tokenizer.json, tokenizer_config.json with the chat template),
// generation_config.json, and for siamese_depth the archs/ remote code (trust_remote_code=True).
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace archspace {

struct ExportOptions {
  std::string tokenizer;  // "": the one the model directory carries, else dolma2 (model_tokenizer)
  at::ScalarType dtype = at::kFloat;
  // An existing, non-empty out_dir is replaced (never one that holds the checkpoint itself); else it is an error.
  bool force = false;
};

// The directory is written beside out_dir under a temporary name and renamed into place when complete, so an
// interrupted export leaves no half directory, and --force swaps the old one out only then.
void export_hf(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& options);

}  // namespace archspace
