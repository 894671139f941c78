// archspace logits: the forward on token ids; fp32 logits [T, vocab] as tensor "logits" (parity tests).
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <iostream>

#include "archspace/io/safetensors.h"
#include "archspace/model/model_io.h"
#include "command.h"

namespace archspace::cli {
namespace {

struct LogitsArgs {
  std::string model, tokens, out, dtype = "fp32", device = "cpu", attention = "sdpa";
  std::string quantization = "none";
  int repeat = 1;  // >1: run the forward again and report each run's time (for bench/)
  bool allow_nonfinite = false, skip_checksums = false;
};

int run(const LogitsArgs& a) {
  const at::Device device = parse_device(a.device, "--device").device();
  const AttentionImpl impl = a.attention == "reference" ? AttentionImpl::kReference : AttentionImpl::kSdpa;
  CausalLM model = load_model(model_dir_to_use(a.model, a.skip_checksums),
                              {scalar_type(parse_dtype(a.dtype, "--dtype")), device, a.allow_nonfinite,
                               parse_quantization(a.quantization, "--quantization")});
  const std::vector<int64_t> ids = parse_token_ids(a.tokens, model.config().vocab_size, "--tokens");
  const at::Tensor input = at::tensor(ids, at::kLong).unsqueeze(0);
  at::Tensor logits;
  std::vector<double> seconds;
  for (int i = 0; i < a.repeat; ++i) {
    c10::InferenceMode inference;  // no autograd bookkeeping
    const auto start = std::chrono::steady_clock::now();
    logits = model.forward(input, SequenceOptions{impl});
    if (device.is_cuda()) logits = logits.to(at::kCPU);  // waits for the device
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  if (a.repeat > 1) {
    std::cerr << "forward_seconds:";
    for (double s : seconds) std::cerr << " " << s;
    std::cerr << "\n";
  }
  save_safetensors(a.out, {{"logits", logits[0].to(at::kCPU, at::kFloat)}});
  std::cerr << "wrote logits [" << ids.size() << ", " << model.config().vocab_size << "] to " << a.out << "\n";
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<LogitsArgs>();
  auto* app = parent.add_subcommand("logits",
                                    "Run the forward on token ids and write fp32 logits [T, vocab] as tensor 'logits'");
  add_model_option(app, a->model, "model directory, or a checkpoint holding one");
  add_skip_checksums_option(app, a->skip_checksums);
  app->add_option("--tokens", a->tokens, "token ids, space or comma separated, e.g. \"1 2 3\"")->required();
  app->add_option("--out", a->out, "output .safetensors file")->required();
  add_dtype_option(app, a->dtype, "compute dtype (the file is always fp32)");
  add_quantization_option(app, a->quantization);
  add_device_option(app, a->device);
  app->add_option("--attention", a->attention,
                  "sdpa (fused kernels) or reference (the plain fp32 path tests compare against)")
      ->check(CLI::IsMember({"sdpa", "reference"}))
      ->capture_default_str();
  app->add_flag("--allow-nonfinite", a->allow_nonfinite,
                "load NaN/Inf weights anyway (inspecting a diverged checkpoint)");
  app->add_option("--repeat", a->repeat, "run the forward N times and print each run's seconds (benchmarks)")
      ->check(CLI::PositiveNumber);
  return {app, [a] { return run(*a); }};
}

}  // namespace
ARCHSPACE_COMMAND(20, add);
}  // namespace archspace::cli
