#include "cuda_graph_step.h"

#include "archspace/util/error.h"

#ifdef ARCHSPACE_WITH_CUDA_GRAPHS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace archspace {

#ifdef ARCHSPACE_WITH_CUDA_GRAPHS

struct CudaGraphStep::Impl {
  explicit Impl(at::Device device) : stream(c10::cuda::getStreamFromPool(false, device.index())) {}
  c10::cuda::CUDAStream stream;
  at::cuda::CUDAGraph graph;
  at::Tensor output;
  bool captured = false;
};

bool CudaGraphStep::built() { return true; }

CudaGraphStep::CudaGraphStep(at::Device device) {
  if (!device.is_cuda()) throw Error("CUDA graphs: the model is on " + device.str() + ", not a CUDA device");
  impl_ = std::make_unique<Impl>(device);
}

at::Tensor CudaGraphStep::warm_up(const std::function<at::Tensor()>& fn) {
  c10::cuda::device_synchronize();
  at::Tensor out;
  {
    c10::cuda::CUDAStreamGuard guard(impl_->stream);
    out = fn();
  }
  c10::cuda::device_synchronize();
  return out;
}

void CudaGraphStep::capture(const std::function<at::Tensor()>& fn) {
  if (impl_->captured) throw Error("CUDA graphs: this step was captured already");
  c10::cuda::device_synchronize();
  {
    c10::cuda::CUDAStreamGuard guard(impl_->stream);
    impl_->graph.capture_begin();
    try {
      impl_->output = fn();
    } catch (...) {
      try {
        impl_->graph.capture_end();  // end the capture the error interrupted; its own error is the lesser one
      } catch (...) {
      }
      throw;
    }
    impl_->graph.capture_end();
  }
  c10::cuda::device_synchronize();
  impl_->captured = true;
}

const at::Tensor& CudaGraphStep::replay() {
  if (!impl_->captured) throw Error("CUDA graphs: replay before capture");
  impl_->graph.replay();
  return impl_->output;
}

#else

struct CudaGraphStep::Impl {};

bool CudaGraphStep::built() { return false; }

namespace {
[[noreturn]] void not_built() {
  throw Error("CUDA graphs: this build has none (LibTorch without CUDA, or the CUDA runtime's headers not found)");
}
}  // namespace

CudaGraphStep::CudaGraphStep(at::Device) { not_built(); }
at::Tensor CudaGraphStep::warm_up(const std::function<at::Tensor()>&) { not_built(); }
void CudaGraphStep::capture(const std::function<at::Tensor()>&) { not_built(); }
const at::Tensor& CudaGraphStep::replay() { not_built(); }

#endif

CudaGraphStep::~CudaGraphStep() = default;

}  // namespace archspace
