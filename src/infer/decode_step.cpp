#include "archspace/infer/decode_step.h"

#include <ATen/record_function.h>

#include <algorithm>

#include "archspace/util/error.h"
#include "cuda_graph_step.h"

namespace archspace {

DecodeMode parse_decode_mode(const std::string& name) {
  if (name == "eager") return DecodeMode::kEager;
  if (name == "fixed-shapes") return DecodeMode::kFixedShapes;
  if (name == "cuda-graph") return DecodeMode::kCudaGraph;
  throw Error("--decode-steps: \"" + name + "\" is not one of eager, fixed-shapes, cuda-graph");
}

const char* decode_mode_name(DecodeMode mode) {
  switch (mode) {
    case DecodeMode::kEager:
      return "eager";
    case DecodeMode::kFixedShapes:
      return "fixed-shapes";
    case DecodeMode::kCudaGraph:
      return "cuda-graph";
  }
  return "?";
}

bool cuda_graphs_built() { return CudaGraphStep::built(); }

int64_t decode_rows_bucket(int64_t rows_in_use, int64_t rows) {
  int64_t bucket = 1;
  while (bucket < rows_in_use) bucket *= 2;
  return std::max<int64_t>(1, std::min(bucket, rows));
}

struct DecodeSteps::Graph {
  explicit Graph(at::Device device) : step(device) {}
  CudaGraphStep step;
};

DecodeSteps::DecodeSteps(const CausalLM& model, KVCache& cache, DecodeMode mode, int64_t end_slot, int64_t rows)
    : model_(model), cache_(cache), mode_(mode) {
  if (mode == DecodeMode::kEager) return;
  if (mode == DecodeMode::kCudaGraph) {
    if (!model.device().is_cuda())
      throw Error("--decode-steps cuda-graph: the model is on " + model.device().str() + "; CUDA graphs need a GPU");
    if (!cuda_graphs_built()) throw Error("--decode-steps cuda-graph: this build has no CUDA graphs");
  }
  cache_.fix_shapes(end_slot, rows);
  ids_ = at::zeros({cache_.batch_size(), 1}, at::TensorOptions().dtype(at::kLong).device(model.device()));
}

DecodeSteps::~DecodeSteps() = default;

at::Tensor DecodeSteps::forward(const at::Tensor& ids) {
  const DecodeOptions options{&cache_, AttentionImpl::kSdpa, /*last_position_only=*/true};
  return model_.forward(ids, options).select(1, 0);
}

at::Tensor DecodeSteps::step(const std::vector<int64_t>& next_ids) {
  RECORD_USER_SCOPE("archspace::decode_step");  // spans in a profile (util/profiler.h)
  const auto n = static_cast<int64_t>(next_ids.size());
  const at::Tensor ids = at::tensor(next_ids, at::kLong).view({n, 1});
  if (mode_ == DecodeMode::kEager) return forward(ids);
  if (n > ids_.size(0) || n < cache_.rows_in_use()) {
    throw Error("decode step: " + std::to_string(n) + " rows, the steps were fixed for " +
                std::to_string(ids_.size(0)) + " (" + std::to_string(cache_.rows_in_use()) + " in use)");
  }
  // The step's inputs go where its kernels read them: the first n rows of the ids' buffer, and the cache's slots.
  const at::Tensor rows_ids = ids_.narrow(0, 0, n);
  rows_ids.copy_(ids);
  cache_.set_active_rows(n);
  cache_.begin_fixed_step();
  const int64_t k = steps_by_rows_[n]++;  // steps run before this one with n rows
  if (mode_ == DecodeMode::kFixedShapes) return forward(rows_ids);
  // CUDA graphs, one per number of rows: its first step warms up (eagerly, on the capture's stream), the second is
  // captured (its forward runs on the host, advancing the cache's length, while its kernels are only recorded) and
  // replayed, and every later step is a replay and the length's advance the forward would have made.
  std::unique_ptr<Graph>& graph = graphs_[n];
  if (!graph) graph = std::make_unique<Graph>(model_.device());
  if (k == 0) return graph->step.warm_up([&] { return forward(rows_ids); });
  if (k == 1) {
    graph->step.capture([&] { return forward(rows_ids); });
    return graph->step.replay();
  }
  const at::Tensor& logits = graph->step.replay();
  cache_.advance(1);
  return logits;
}

}  // namespace archspace
