#include "archspace/infer/decode_step.h"

#include <ATen/record_function.h>

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

struct DecodeSteps::Graph {
  explicit Graph(at::Device device) : step(device) {}
  CudaGraphStep step;
};

DecodeSteps::DecodeSteps(const CausalLM& model, KVCache& cache, DecodeMode mode, int64_t end_slot)
    : model_(model), cache_(cache), mode_(mode) {
  if (mode == DecodeMode::kEager) return;
  if (mode == DecodeMode::kCudaGraph) {
    if (!model.device().is_cuda())
      throw Error("--decode-steps cuda-graph: the model is on " + model.device().str() + "; CUDA graphs need a GPU");
    if (!cuda_graphs_built()) throw Error("--decode-steps cuda-graph: this build has no CUDA graphs");
    graph_ = std::make_unique<Graph>(model.device());
  }
  cache_.fix_shapes(end_slot);
  ids_ = at::zeros({cache_.batch_size(), 1}, at::TensorOptions().dtype(at::kLong).device(model.device()));
}

DecodeSteps::~DecodeSteps() = default;

at::Tensor DecodeSteps::forward(const at::Tensor& ids) {
  const DecodeOptions options{&cache_, AttentionImpl::kSdpa, /*last_position_only=*/true};
  return model_.forward(ids, options).select(1, 0);
}

at::Tensor DecodeSteps::step(const std::vector<int64_t>& next_ids) {
  RECORD_USER_SCOPE("archspace::decode_step");  // spans in a profile (util/profiler.h)
  const at::Tensor ids = at::tensor(next_ids, at::kLong).view({static_cast<int64_t>(next_ids.size()), 1});
  if (mode_ == DecodeMode::kEager) return forward(ids);
  if (ids.size(0) != ids_.size(0)) {
    throw Error("decode step: " + std::to_string(ids.size(0)) + " rows, the steps were fixed for " +
                std::to_string(ids_.size(0)));
  }
  // The step's inputs go where its kernels read them: the ids' buffer and the cache's slot.
  ids_.copy_(ids);
  cache_.begin_fixed_step();
  const int64_t n = steps_++;
  if (mode_ == DecodeMode::kFixedShapes) return forward(ids_);
  // CUDA graphs: the first step warms up (eagerly, on the capture's stream), the second is captured (its forward
  // runs on the host, advancing the cache's length, while its kernels are only recorded) and replayed, and
  // every later step is a replay and the length's advance the forward would have made.
  if (n == 0) return graph_->step.warm_up([&] { return forward(ids_); });
  if (n == 1) {
    graph_->step.capture([&] { return forward(ids_); });
    return graph_->step.replay();
  }
  const at::Tensor& logits = graph_->step.replay();
  cache_.advance(1);
  return logits;
}

}  // namespace archspace
