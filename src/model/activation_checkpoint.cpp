#include "archspace/model/activation_checkpoint.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "archspace/util/error.h"

namespace archspace {

namespace {

// Fresh leaves standing for `inputs` (the graph of a run of the block ends at them), and what the block
// is given: a view of each, not the leaf itself, because autocast caches its bf16 cast of an fp32 leaf
// that requires grad, and one cast shared by several readers (q, k and v of a block input) would sum
// their gradients in bf16, where the forward without checkpointing casts (and sums) per reader.
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> stand_ins(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> leaves, given;
  for (const at::Tensor& t : inputs) {
    at::Tensor leaf = t.detach().requires_grad_(t.requires_grad());
    given.push_back(t.requires_grad() ? leaf.view_as(leaf) : leaf);
    leaves.push_back(std::move(leaf));
  }
  return {leaves, given};
}

// The autocast state of the devices the engine runs on, captured in forward and restored for the
// recomputation (backward runs outside the caller's autocast scope, maybe on another thread).
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kBFloat16;

  static AutocastState current() {
    AutocastState s;
    s.cpu = at::autocast::is_autocast_enabled(at::kCPU);
    s.cuda = at::autocast::is_autocast_enabled(at::kCUDA);
    s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    return s;
  }
};

// Sets an autocast state for a scope and puts the previous one back (clearing the cast cache when
// autocast ends, as torch.autocast does).
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& s) : previous_(AutocastState::current()) { set(s); }
  ~AutocastScope() {
    set(previous_);
    if (!previous_.cpu && !previous_.cuda) at::autocast::clear_cache();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  static void set(const AutocastState& s) {
    at::autocast::set_autocast_dtype(at::kCPU, s.cpu_dtype);
    at::autocast::set_autocast_dtype(at::kCUDA, s.cuda_dtype);
    at::autocast::set_autocast_enabled(at::kCPU, s.cpu);
    at::autocast::set_autocast_enabled(at::kCUDA, s.cuda);
  }
  AutocastState previous_;
};

// What the node keeps besides the saved inputs: the function and the forward's autocast state.
struct BlockHolder : torch::CustomClassHolder {
  BlockFunction fn;
  size_t num_inputs = 0;
  std::vector<at::Tensor> params;  // held by the model anyway
  AutocastState autocast;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // `tensors`: the block's inputs, then its parameters.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<BlockHolder> holder, at::TensorList tensors) {
    std::vector<at::Tensor> inputs(tensors.begin(), tensors.begin() + holder->num_inputs);
    holder->autocast = AutocastState::current();
    std::vector<at::Tensor> outputs;
    {
      // Function::apply calls this without grad, but some kernels are chosen by whether gradients are
      // wanted (SDPA's, on the CPU and on CUDA): with grad on and the inputs as leaves like those of the
      // recomputation, the values passed on are bit for bit the ones backward recomputes. The graph
      // this builds lives for this block only (the outputs are detached from it).
      at::AutoGradMode grad(true);
      for (const at::Tensor& out : holder->fn(stand_ins(inputs).second)) outputs.push_back(out.detach());
    }
    ctx->save_for_backward(inputs);
    ctx->saved_data["block"] = c10::IValue::make_capsule(holder);
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto holder = c10::static_intrusive_pointer_cast<BlockHolder>(ctx->saved_data["block"].toCapsule());
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const std::vector<at::Tensor>& params = holder->params;
    at::AutoGradMode grad(true);
    // Fresh leaves for the inputs, so the recomputed graph ends here and not in the earlier blocks.
    const auto [inputs, given] = stand_ins(saved);
    std::vector<at::Tensor> outputs;
    {
      // The forward's autocast state for the recomputation only: the gradients below are taken outside it, as
      // the backward without checkpointing is (and as torch.utils.checkpoint does). Under autocast an fp32
      // matmul of the backward (the widened bf16 matmuls' backward GEMMs, kernels/bf16_matmuls.h) would be cast
      // to bf16.
      AutocastScope autocast(holder->autocast);
      outputs = holder->fn(given);
    }
    if (outputs.size() != grad_outputs.size()) throw Error("activation checkpointing: the block changed its outputs");

    std::vector<at::Tensor> roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (grad_outputs[i].defined() && outputs[i].requires_grad()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    std::vector<at::Tensor> wrt;
    std::vector<size_t> slot;  // position in the returned list (after the holder's slot)
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].requires_grad()) {
        wrt.push_back(inputs[i]);
        slot.push_back(1 + i);
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].requires_grad()) {
        wrt.push_back(params[i]);
        slot.push_back(1 + inputs.size() + i);
      }
    }
    torch::autograd::variable_list result(1 + inputs.size() + params.size());
    if (roots.empty() || wrt.empty()) return result;
    const torch::autograd::variable_list grads =
        torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false, /*create_graph=*/false,
                              /*allow_unused=*/true);
    for (size_t i = 0; i < grads.size(); ++i) result[slot[i]] = grads[i];
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> checkpointed(BlockFunction fn, const std::vector<at::Tensor>& inputs,
                                     const std::vector<at::Tensor>& params) {
  auto holder = c10::make_intrusive<BlockHolder>();
  holder->fn = std::move(fn);
  holder->num_inputs = inputs.size();
  holder->params = params;
  std::vector<at::Tensor> tensors(inputs);
  tensors.insert(tensors.end(), params.begin(), params.end());
  return CheckpointFunction::apply(holder, at::TensorList(tensors));
}

}  // namespace archspace
