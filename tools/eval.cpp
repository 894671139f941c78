// archspace eval ppl: perplexity with strided sliding windows on token shards or a text file.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "archspace/data/token_shards.h"
#include "archspace/eval/perplexity.h"
#include "archspace/io/run_dir.h"
#include "archspace/model/model_io.h"
#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"
#include "archspace/util/progress.h"
#include "command.h"

namespace archspace::cli {
namespace {

struct PplArgs {
  std::string model, data, tokenizer, out, dtype = "fp32", device = "cpu";
  int64_t max_tokens = 0;
  PerplexityOptions options;
};

// A bad --out fails before the evaluation, not after it; an existing file is replaced only by a complete
// result (written beside it, then renamed).
void check_writable(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path), dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0) {
    throw Error(path + ": cannot write there (--out): " + dir.string() + " is not a writable directory");
  }
  if (fs::exists(p) && (!fs::is_regular_file(p) || ::access(p.c_str(), W_OK) != 0)) {
    throw Error(path + ": exists and is not a writable file (--out)");
  }
}

void write_result(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp);
      throw Error(path + ": write failed (disk full?) (--out)");
    }
  }
  std::filesystem::rename(tmp, path);
}

int run_ppl(const PplArgs& a) {
  namespace fs = std::filesystem;
  if (!a.out.empty()) check_writable(a.out);
  const std::string model_dir = resolve_model_dir(a.model);  // a run directory or checkpoint names its model
  CausalLM model = load_model(
      model_dir, {scalar_type(parse_dtype(a.dtype, "--dtype")), parse_device(a.device, "--device").device()});
  std::vector<int64_t> tokens;
  std::string tokenizer_name;
  if (fs::exists(fs::path(a.data) / "manifest.json")) {
    auto shards = TokenShards::open(a.data);
    tokenizer_name = shards->manifest().tokenizer_name;
    tokens = shards->read_all();
  } else {
    auto tokenizer = model_tokenizer(model_dir, a.tokenizer, model.config().vocab_size);
    tokenizer_name = tokenizer->name();
    for (uint32_t id : encode_text_file(*tokenizer, a.data)) tokens.push_back(id);
  }
  if (a.max_tokens > 0 && static_cast<int64_t>(tokens.size()) > a.max_tokens) tokens.resize(a.max_tokens);

  ProgressLine progress("eval ppl");
  const PerplexityResult r = perplexity(model, tokens, a.options, [&](int64_t done, int64_t total) {
    progress.update(std::to_string(done) + "/" + std::to_string(total) + " tokens", static_cast<double>(done) / total,
                    done == total);
  });
  progress.finish();
  const nlohmann::json j = {{"model", a.model},
                            {"data", a.data},
                            {"tokenizer", tokenizer_name},
                            {"tokens", tokens.size()},
                            {"scored_tokens", r.scored_tokens},
                            {"nll_sum", r.nll_sum},
                            {"mean_nll", r.nll_sum / r.scored_tokens},
                            {"perplexity", r.perplexity()},
                            {"context", r.context},
                            {"stride", r.stride},
                            {"windows", r.windows},
                            {"method",
                             "strided sliding windows: each window scores only tokens no earlier window scored; ppl = "
                             "exp(total NLL / scored tokens)"},
                            {"seconds", progress.elapsed_seconds()}};
  if (!a.out.empty()) write_result(a.out, j.dump(2) + "\n");
  std::cout << j.dump(2) << std::endl;
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<PplArgs>();
  auto* eval = parent.add_subcommand("eval", "Evaluate a model (ppl: perplexity)");
  eval->require_subcommand(1);
  auto* ppl = eval->add_subcommand("ppl", "Perplexity on token shards or a text file (JSON result)");
  ppl->add_option("--model", a->model, "model directory, or a checkpoint or finished run directory holding one")
      ->required();
  ppl->add_option("--data", a->data, "token shard directory, or a text file (tokenized with the model's tokenizer)")
      ->required();
  ppl->add_option("--context", a->options.context, "window length (default min(max_position_embeddings, 4096))");
  ppl->add_option("--stride", a->options.stride, "window start spacing (default = context: disjoint windows)");
  ppl->add_option("--max-tokens", a->max_tokens, "evaluate only the first N tokens");
  ppl->add_option("--tokenizer", a->tokenizer,
                  "tokenizer for text data (default: the one the model directory carries)");
  ppl->add_option("--out", a->out, "also write the JSON result here");
  add_dtype_option(ppl, a->dtype, "compute dtype");
  add_device_option(ppl, a->device);
  return {eval, [a, ppl]() -> int {
            if (ppl->parsed()) return run_ppl(*a);
            return 1;  // unreachable: eval requires a subcommand
          }};
}

}  // namespace
ARCHSPACE_COMMAND(100, add);
}  // namespace archspace::cli
