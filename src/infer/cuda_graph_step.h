// The GPU-only part of decoding with CUDA graphs (infer/decode_step.h): a side stream to warm up and capture on,
// one captured graph, its replay. Compiled against CUDA only where LibTorch has CUDA and the CUDA runtime's
// headers are found (CMake sets ARCHSPACE_WITH_CUDA_GRAPHS for cuda_graph_step.cpp alone); elsewhere every call
// but built() throws. Its CPU reference is the same step run eagerly (DecodeMode::kFixedShapes).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>

namespace archspace {

class CudaGraphStep {
 public:
  static bool built();
  explicit CudaGraphStep(at::Device device);  // a CUDA device
  ~CudaGraphStep();
  // Runs fn on the side stream, the device synchronised before and after (lazy initialisation, the BLAS
  // handles and workspaces of that stream, happen here and not under capture).
  at::Tensor warm_up(const std::function<at::Tensor()>& fn);
  // Records fn's kernels on the side stream (their work is not done: replay does it) and keeps its output.
  void capture(const std::function<at::Tensor()>& fn);
  // Launches the recorded kernels on the current stream; their output, in the memory the capture gave it.
  const at::Tensor& replay();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace archspace
