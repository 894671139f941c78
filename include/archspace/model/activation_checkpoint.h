// Activation checkpointing: run a block without keeping its intermediates, and recompute them in
// backward. LibTorch's C++ API has no torch.utils.checkpoint; this is one custom autograd
// node doing what its reentrant variant does, with autograd::grad in place of a nested backward. The parameters the
// block reads are inputs of that node, so their gradients reach them through the outer backward as usual (data-parallel
// gradient hooks see nothing unusual).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace archspace {

// A block as a pure function of the tensors it reads besides its parameters. It must compute the same
// values when called again (no randomness: the engine has no dropout) and may read only `inputs`, the
// parameters and tensors that do not need gradients (RoPE tables) which it holds itself.
using BlockFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

// fn(inputs) with autograd keeping only `inputs` (and the parameters, which live anyway): forward runs
// fn and keeps none of its graph; backward reruns fn with grad enabled and the forward's autocast state,
// then back-propagates the outputs' gradients to `inputs` and `params`. Both runs choose the same kernels
// (forward runs with grad on too, see the .cpp), so on a deterministic device the recomputation is bit
// for bit the forward, and the gradients are those of running fn directly, up to the order in which
// gradients of tensors read by several blocks are summed.
std::vector<at::Tensor> checkpointed(BlockFunction fn, const std::vector<at::Tensor>& inputs,
                                     const std::vector<at::Tensor>& params);

}  // namespace archspace
