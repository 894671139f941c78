// archspace analyze: the SiameseNorm paper's analyses of one model on held-out tokens (docs/analysis.md):
// stream norms, layer pruning, logit lens per stream, input intensity, fusion and Depth-Attention weights.
// The analyses are the library's (eval/analyze.h); this reads the data, writes OUT/analysis.json, prints a
// per-layer table and draws OUT/analysis.png with scripts/plot_analysis.py.
#include "archspace/eval/analyze.h"

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "archspace/data/token_source.h"
#include "archspace/io/run_dir.h"
#include "archspace/model/model_io.h"
#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/progress.h"
#include "command.h"

namespace archspace::cli {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

struct AnalyzeArgs {
  std::string model, data, tokenizer, out, dtype = "fp32", device = "cpu";
  bool skip_checksums = false;
  int64_t sequences = 8, sequence_length = 256;
  bool no_plot = false;
};

// The first sequences x length tokens of the data (token shards, or a text file the model's tokenizer encodes).
at::Tensor read_tokens(const AnalyzeArgs& a, const std::string& model_dir, int64_t vocab) {
  const int64_t need = a.sequences * a.sequence_length;
  std::vector<int64_t> ids;
  if (detect_token_format(a.data)) {
    TokenSourceOptions source;
    source.vocab_size = vocab;
    auto shards = open_token_source(a.data, source);
    std::vector<uint32_t> buf;
    for (size_t s = 0; s < shards->num_shards() && static_cast<int64_t>(ids.size()) < need; ++s) {
      const uint64_t n = std::min<uint64_t>(shards->shard_tokens(s), need - ids.size());
      buf.resize(n);
      shards->read(s, 0, n, buf.data());
      ids.insert(ids.end(), buf.begin(), buf.end());
    }
  } else {
    auto tokenizer = model_tokenizer(model_dir, a.tokenizer, vocab);
    for (uint32_t id : encode_text_file(*tokenizer, a.data)) ids.push_back(id);
  }
  if (static_cast<int64_t>(ids.size()) < need) {
    throw Error(a.data + ": " + std::to_string(ids.size()) +
                " tokens, fewer than --sequences x --sequence-length = " + std::to_string(need));
  }
  ids.resize(need);
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab)
      throw Error(a.data + ": token id " + std::to_string(id) + " is outside the model's vocabulary");
  }
  return at::tensor(ids, at::kLong).view({a.sequences, a.sequence_length});
}

std::string fixed(double v, int digits = 4) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

void print_table(const json& r) {
  std::printf("loss %.4f over %lld x %lld tokens\n", r["loss"].get<double>(), r["sequences"].get<long long>(),
              r["sequence_length"].get<long long>());
  std::printf("%5s  %12s", "layer", "prune dloss");
  for (const auto& [name, s] : r["streams"].items()) std::printf("  %10s %8s", (name + " norm").c_str(), "lens");
  std::printf("\n");
  for (int64_t l = 0; l < r["layers"].get<int64_t>(); ++l) {
    std::printf("%5lld  %12s", static_cast<long long>(l), fixed(r["pruning"][l]["delta"].get<double>()).c_str());
    for (const auto& [name, s] : r["streams"].items()) {
      std::printf("  %10s %8s", fixed(s["norm"][l + 1].get<double>(), 2).c_str(),
                  fixed(s["lens_agreement"][l].get<double>(), 3).c_str());
    }
    std::printf("\n");
  }
}

// The default output: beside the model, not in the directory the command runs in (often the repository):
// RUN/analysis/step-N for a checkpoint of a run, else MODEL_DIR/analysis.
std::string default_out(const std::string& model_dir) {
  const std::string checkpoint = checkpoint_of_model_dir(model_dir);
  const std::string run = checkpoint.empty() ? "" : run_dir_of_checkpoint(checkpoint);
  if (!run.empty()) return (fs::path(run) / "analysis" / fs::path(checkpoint).lexically_normal().filename()).string();
  return (fs::path(model_dir) / "analysis").string();
}

int run(AnalyzeArgs a) {
  const std::string model_dir =
      model_dir_to_use(a.model, a.skip_checksums);  // a run directory, checkpoint or model directory
  if (a.out.empty()) a.out = default_out(model_dir);
  fs::create_directories(a.out);
  CausalLM model = load_model(
      model_dir, {scalar_type(parse_dtype(a.dtype, "--dtype")), parse_device(a.device, "--device").device()});
  const at::Tensor tokens = read_tokens(a, model_dir, model.config().vocab_size);
  ProgressLine progress("analyze");
  json r = analyze_model(model, tokens, {}, [&](int64_t done, int64_t total) {
    progress.update(std::to_string(done) + "/" + std::to_string(total) + " forwards", static_cast<double>(done) / total,
                    done == total);
  });
  progress.finish();
  r["model"] = a.model;
  r["data"] = a.data;
  r["dtype"] = a.dtype;
  const std::string json_path = (fs::path(a.out) / "analysis.json").string();
  write_text_file_atomically(json_path, r.dump(2) + "\n");
  print_table(r);
  std::cout << "wrote " << json_path << "\n";
  if (!a.no_plot) {
    plot_or_warn(ARCHSPACE_ANALYSIS_PLOT_SCRIPT, {json_path, "--out", (fs::path(a.out) / "analysis.png").string()},
                 "the analysis plot");
  }
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<AnalyzeArgs>();
  auto* app = parent.add_subcommand(
      "analyze", "Stream norms, layer pruning, logit lens, input intensity and Depth-Attention weights of a model");
  add_model_option(app, a->model, "a run directory, checkpoint or model directory");
  add_skip_checksums_option(app, a->skip_checksums);
  app->add_option("--data", a->data, "held-out token shards (or Megatron / OLMo-core token files), or a text file")
      ->required();
  app->add_option("--out", a->out,
                  "output directory (analysis.json, analysis.png); default: RUN/analysis/step-N for a run's "
                  "checkpoint, else MODEL_DIR/analysis");
  app->add_option("--sequences", a->sequences, "sequences analysed")->check(CLI::PositiveNumber)->capture_default_str();
  app->add_option("--sequence-length", a->sequence_length, "tokens per sequence")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20))
      ->capture_default_str();
  app->add_option("--tokenizer", a->tokenizer, "for a text file: tokenizer.json (default: the model's)");
  add_dtype_option(app, a->dtype, "compute dtype");
  add_device_option(app, a->device);
  app->add_flag("--no-plot", a->no_plot, "do not draw OUT/analysis.png");
  return {app, [a] { return run(*a); }};
}

}  // namespace
ARCHSPACE_COMMAND(105, add);
}  // namespace archspace::cli
