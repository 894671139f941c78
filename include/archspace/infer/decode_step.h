// The decoding steps of generate() after its prefill: one token per row through the model with its KV cache.
//
// A decoding step of a small model on a GPU is bound by the host: ~875 kernel launches a token for the 1B
// (docs/gpu.md), while the kernels themselves take a seventh of the step. A CUDA graph captures one step's
// launches and replays them with one call; it needs every step to launch the same kernels on the same memory,
// which the KV cache's fixed-shape mode gives (model/kv_cache.h: fix_shapes). So there are three ways to run
// the steps: eager (the cache's shapes grow with the length: the default), fixed shapes run eagerly (any device:
// on the CPU the reference the graph is checked against), and fixed shapes captured once and replayed (CUDA).
//
// A fixed-shape step computes the batch's first rows only, a bucket of them (decode_rows_bucket: 1, 2, 4, 8, ... up
// to the batch's rows), as vLLM captures a graph per batch size: the rows past the highest in use are idle, so a
// batch whose rows finish runs smaller steps, each bucket's graph captured at its first two steps and replayed from
// then on, on views of the same buffers (KVCache::set_active_rows).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "archspace/model/causal_lm.h"
#include "archspace/model/kv_cache.h"

namespace archspace {

enum class DecodeMode {
  kEager,        // shapes follow the cache's length
  kFixedShapes,  // KVCache::fix_shapes, each step run eagerly
  kCudaGraph,    // fixed shapes; the first step eagerly (warming up), the second captured, then replayed
};

// "eager", "fixed-shapes", "cuda-graph" (the CLI's names); throws listing them for anything else.
DecodeMode parse_decode_mode(const std::string& name);
const char* decode_mode_name(DecodeMode mode);

// Whether this build can capture CUDA graphs (LibTorch with CUDA, built with the CUDA runtime's headers).
bool cuda_graphs_built();

// The rows a fixed-shape step computes when rows 0 .. rows_in_use - 1 may be in use, of a batch of `rows`: the
// smallest power of two at or above rows_in_use, at most `rows` (at least 1).
int64_t decode_rows_bucket(int64_t rows_in_use, int64_t rows);

class DecodeSteps {
 public:
  // After the prefill of `cache` (batch rows, length L): the steps fill slots L .. end_slot - 1 at most. rows: the
  // batch's rows under fixed shapes (0: the cache's; more: idle rows added for sequences to join).
  // kCudaGraph needs a CUDA model and cuda_graphs_built(); each mode's errors name it.
  DecodeSteps(const CausalLM& model, KVCache& cache, DecodeMode mode, int64_t end_slot, int64_t rows = 0);
  ~DecodeSteps();
  DecodeSteps(const DecodeSteps&) = delete;
  DecodeSteps& operator=(const DecodeSteps&) = delete;

  // One step: the next token of each row in, each row's logits for the token after it out ([B, V] in the
  // model's dtype, on its device; under kCudaGraph a view of the graph's output, valid until the next step).
  // Under fixed shapes the ids may be those of the first rows only (any count from the cache's rows_in_use up to
  // its rows; the rows past them idle): the step computes those rows alone.
  at::Tensor step(const std::vector<int64_t>& next_ids);

  // Fixed shapes: how many steps ran with each number of rows (the buckets a CUDA graph was captured for).
  const std::map<int64_t, int64_t>& steps_by_rows() const { return steps_by_rows_; }

 private:
  at::Tensor forward(const at::Tensor& ids);  // the model's forward of [B, 1] ids with the cache

  const CausalLM& model_;
  KVCache& cache_;
  DecodeMode mode_;
  at::Tensor ids_;  // [B, 1] int64 on the model's device: the fixed-shape steps' input, fixed in memory
  struct Graph;     // a captured step for one number of rows (decode_step.cpp; CUDA builds only)
  std::map<int64_t, std::unique_ptr<Graph>> graphs_;  // by the number of rows
  std::map<int64_t, int64_t> steps_by_rows_;
};

}  // namespace archspace
