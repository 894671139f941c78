// archspace trace: every named activation of one forward (model/trace.h) and the logits, as safetensors:
// for finding where two implementations part ways (the parity tests name the first tensor that differs).
#include "archspace/model/trace.h"

#include <iostream>

#include "archspace/io/run_dir.h"
#include "archspace/io/safetensors.h"
#include "archspace/model/model_io.h"
#include "command.h"

namespace archspace::cli {
namespace {

struct TraceArgs {
  std::string model, tokens, out, attention = "sdpa", dtype = "fp32", device = "cpu";
  bool skip_checksums = false;
  bool allow_nonfinite = false;
};

int run(const TraceArgs& a) {
  CausalLM model = load_model(
      model_dir_to_use(a.model, a.skip_checksums),
      {scalar_type(parse_dtype(a.dtype, "--dtype")), parse_device(a.device, "--device").device(), a.allow_nonfinite});
  const at::Tensor ids =
      at::tensor(parse_token_ids(a.tokens, model.config().vocab_size, "--tokens"), at::kLong).unsqueeze(0);
  const NamedTensors trace =
      trace_activations(model, ids, a.attention == "reference" ? AttentionImpl::kReference : AttentionImpl::kSdpa);
  save_safetensors(a.out, trace);
  std::cerr << "wrote " << trace.size() << " named activations (fp32, batch dimension kept) to " << a.out << "\n";
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<TraceArgs>();
  auto* app =
      parent.add_subcommand("trace", "Write every named activation of one forward and the logits (fp32 safetensors)");
  add_model_option(app, a->model, "model directory, or a checkpoint or finished run directory holding one");
  add_skip_checksums_option(app, a->skip_checksums);
  app->add_option("--tokens", a->tokens, "token ids, space or comma separated, e.g. \"1 2 3\"")->required();
  app->add_option("--out", a->out, "output .safetensors file")->required();
  app->add_option("--attention", a->attention, "sdpa (fused kernels) or reference (plain fp32 path)")
      ->check(CLI::IsMember({"sdpa", "reference"}))
      ->capture_default_str();
  app->add_flag("--allow-nonfinite", a->allow_nonfinite,
                "load NaN/Inf weights anyway (finding where a diverged model breaks)");
  add_dtype_option(app, a->dtype, "compute dtype (the file is always fp32)");
  add_device_option(app, a->device);
  return {app, [a] { return run(*a); }};
}

}  // namespace
ARCHSPACE_COMMAND(25, add);
}  // namespace archspace::cli
