// Decode of one model held as fp32, bf16 and int8 weights in one process, their steps interleaved (issue 25 items 1
// and 4). Each round prefills the prompt into a fresh KV cache per variant, then decodes --new greedy tokens,
// one step of every variant after another (the order rotating every step), so that a change in the machine's memory
// bandwidth (on a shared host it moves by tens of percent within seconds) falls on all variants alike instead of on
// whichever process ran then. A step is the call `archspace generate` makes: forward of one token with the cache,
// the last position's logits to fp32 on the CPU, argmax. Each variant follows its own greedy tokens; what a step
// costs does not depend on which token it is.
// --batch B decodes B rows at once (row b: the prompt rotated left by b tokens, so all have its length and no
// padding), as `generate --prompts-file` and `serve`'s running batch do.
// Reports per round each variant's decode tokens/s (all rows) and its ratio to fp32, and their medians and ranges
// over the rounds; JSON to --out. bench/bench_decode_dtype.py runs it beside the whole-command figures.
//
//     build/bench_decode_steps --model DIR --prompt-tokens "1 2 3 ..." [--new 64] [--rounds 5] [--threads N]
//                              [--batch 1] [--variants fp32,bf16,int8] [--out FILE]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "archspace/kernels/argmax.h"
#include "archspace/kernels/cpu_isa.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/kv_cache.h"
#include "archspace/model/model_io.h"

using namespace archspace;

namespace {

struct DecodeVariant {
  std::string name;
  LoadOptions load;
  std::unique_ptr<CausalLM> model;
  std::unique_ptr<KVCache> cache;
  std::vector<int64_t> next;                 // the token each row's next step reads
  std::vector<double> tokens_per_s;          // one per round, all rows
  std::vector<std::vector<int64_t>> tokens;  // each row's greedy tokens in the first round (the same every round)
};

// The logits of each row's last position, as generate() samples from them, and the greedy choices.
std::vector<int64_t> step(DecodeVariant& v, const at::Tensor& ids) {
  const DecodeOptions fwd{v.cache.get(), AttentionImpl::kSdpa, /*last_position_only=*/true};
  const at::Tensor last = logits_to_float(v.model->forward(ids, fwd).select(1, 0));
  std::vector<int64_t> next;
  for (int64_t b = 0; b < last.size(0); ++b) next.push_back(argmax_index(last[b]));
  return next;
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const size_t n = x.size();
  return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

}  // namespace

int run(int argc, char** argv) {
  std::string model_dir, out;
  std::vector<int64_t> prompt;
  int64_t new_tokens = 64, batch = 1;
  int rounds = 5, threads = 0;
  std::string only;  // --variants: a comma-separated subset of fp32,bf16,int8 (profiling one alone)
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") {
      model_dir = value;
    } else if (flag == "--prompt-tokens") {
      std::istringstream in(value);
      for (int64_t id; in >> id;) prompt.push_back(id);
    } else if (flag == "--new") {
      new_tokens = std::stoll(value);
    } else if (flag == "--rounds") {
      rounds = std::stoi(value);
    } else if (flag == "--threads") {
      threads = std::stoi(value);
    } else if (flag == "--batch") {
      batch = std::stoll(value);
    } else if (flag == "--variants") {
      only = "," + value + ",";
    } else if (flag == "--out") {
      out = value;
    } else {
      std::cerr << "unknown option " << flag << "\n";
      return 2;
    }
  }
  if (model_dir.empty() || prompt.empty() || new_tokens < 1 || rounds < 1 || batch < 1 || batch > 1024) {
    std::cerr << "usage: bench_decode_steps --model DIR --prompt-tokens \"ids\" [--new N >= 1] [--rounds R >= 1] "
                 "[--threads N] [--batch B in 1..1024] [--variants fp32,bf16,int8] [--out FILE]\n";
    return 2;
  }
  if (threads > 0) at::set_num_threads(threads);
  c10::InferenceMode inference;

  std::vector<DecodeVariant> variants(3);
  variants[0].name = "fp32";
  variants[1].name = "bf16";
  variants[1].load.dtype = at::kBFloat16;
  variants[2].name = "int8";
  variants[2].load.quantization = Quantization::kInt8;
  if (!only.empty()) {
    variants.erase(
        std::remove_if(variants.begin(), variants.end(),
                       [&](const DecodeVariant& v) { return only.find("," + v.name + ",") == std::string::npos; }),
        variants.end());
  }
  if (variants.empty()) {
    std::cerr << "--variants: none of fp32, bf16, int8\n";
    return 2;
  }
  for (DecodeVariant& v : variants) v.model = std::make_unique<CausalLM>(load_model(model_dir, v.load));
  std::vector<int64_t> rows;  // row b: the prompt rotated left by b
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> row = prompt;
    std::rotate(row.begin(), row.begin() + static_cast<ptrdiff_t>(b % static_cast<int64_t>(prompt.size())), row.end());
    rows.insert(rows.end(), row.begin(), row.end());
  }
  const at::Tensor prompt_ids = at::tensor(rows, at::kLong).view({batch, -1});

  using clock = std::chrono::steady_clock;
  const size_t n = variants.size();
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> seconds(n, 0.0);
    for (DecodeVariant& v : variants) {
      v.cache = std::make_unique<KVCache>(v.model->config());
      v.next = step(v, prompt_ids);
      if (r == 0)
        for (int64_t id : v.next) v.tokens.push_back({id});
    }
    for (int64_t s = 0; s < new_tokens; ++s) {
      for (size_t j = 0; j < n; ++j) {
        const size_t i = (j + static_cast<size_t>(s + r)) % n;  // rotate which goes first
        DecodeVariant& v = variants[i];
        const at::Tensor ids = at::tensor(v.next, at::kLong).view({batch, 1});
        const auto t0 = clock::now();
        v.next = step(v, ids);
        seconds[i] += std::chrono::duration<double>(clock::now() - t0).count();
        if (r == 0)
          for (int64_t b = 0; b < batch; ++b) v.tokens[b].push_back(v.next[b]);
      }
    }
    for (size_t i = 0; i < n; ++i)
      variants[i].tokens_per_s.push_back(static_cast<double>(batch * new_tokens) / seconds[i]);
  }

  nlohmann::ordered_json result = {{"benchmark", "decode-steps-interleaved"},
                                   {"model", model_dir},
                                   {"prompt_tokens", prompt.size()},
                                   {"new_tokens", new_tokens},
                                   {"batch", batch},
                                   {"rounds", rounds},
                                   {"threads", at::get_num_threads()},
                                   {"kernel_path", cpu_isa_name(max_cpu_isa())}};
  std::printf(
      "batch-%lld decode, steps interleaved in one process: prompt %zu, %lld new tokens, %d rounds, %d threads, "
      "kernel path %s\n",
      static_cast<long long>(batch), prompt.size(), static_cast<long long>(new_tokens), rounds, at::get_num_threads(),
      cpu_isa_name(max_cpu_isa()));
  const bool has_fp32 = variants[0].name == "fp32";
  const std::vector<double>& fp32 = variants[0].tokens_per_s;
  for (const DecodeVariant& v : variants) {
    const auto [lo, hi] = std::minmax_element(v.tokens_per_s.begin(), v.tokens_per_s.end());
    result[v.name + "_decode_tok_s"] = v.tokens_per_s;
    result[v.name + "_tokens"] = v.tokens.front();  // row 0's (the only row at --batch 1)
    result[v.name + "_tokens_by_row"] = v.tokens;
    std::printf("  %s: median %.1f tok/s (range %.1f-%.1f)", v.name.c_str(), median(v.tokens_per_s), *lo, *hi);
    if (has_fp32 && &v != &variants[0]) {
      std::vector<double> ratio;
      for (size_t r = 0; r < fp32.size(); ++r) ratio.push_back(v.tokens_per_s[r] / fp32[r]);
      const auto [rlo, rhi] = std::minmax_element(ratio.begin(), ratio.end());
      result[v.name + "_over_fp32"] = ratio;
      result[v.name + "_over_fp32_median"] = median(ratio);
      std::printf("; / fp32: median %.3fx (range %.3f-%.3f)", median(ratio), *rlo, *rhi);
    }
    std::printf("\n");
  }
  if (!out.empty()) std::ofstream(out) << result.dump(2) << "\n";
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a model that does not load, a flag value that is not a number
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
