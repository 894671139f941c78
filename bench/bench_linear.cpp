// Decode-shaped matrix products: the engine's streaming kernel (model/linear) against at::linear, on the
// weight shapes of a preset, for 1 and 4 rows, fp32, CPU. Reports GB/s of weights read and the ratio
// (at::linear time / streaming time: > 1 means the kernel is faster), the median of --repeat timings,
// and checks the two results agree. JSON to bench/results/linear-<time>.json (--out), a table on stdout.
// A weight that fits in the last-level cache stays there across repeats, so its GB/s can exceed memory
// bandwidth; in a real decode step the 12 layers' weights do not fit, and the lm_head row (hundreds of
// MB) is the memory-bound case.
//
//     build/bench_linear [--preset 190M] [--threads N] [--repeat 20] [--rows 1,4] [--out FILE]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/config/model_config.h"
#include "archspace/model/linear.h"

using namespace archspace;

namespace {
template <typename F>
double median_seconds(int repeat, F&& f) {
  f();  // warm-up: page in the weights, wake the threads
  std::vector<double> times;
  for (int i = 0; i < repeat; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  std::string preset_name = "190M", out;
  int threads = 0, repeat = 20;
  std::vector<int64_t> row_counts = {1, 4};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--preset")
      preset_name = value;
    else if (flag == "--threads")
      threads = std::stoi(value);
    else if (flag == "--repeat")
      repeat = std::stoi(value);
    else if (flag == "--out")
      out = value;
    else if (flag == "--rows") {
      row_counts.clear();
      for (size_t at = 0; at < value.size();) {
        const size_t comma = std::min(value.find(',', at), value.size());
        row_counts.push_back(std::stoll(value.substr(at, comma - at)));
        at = comma + 1;
      }
    } else {
      std::cerr << "unknown option " << flag << "\n";
      return 2;
    }
  }
  if (threads > 0) at::set_num_threads(threads);
  c10::InferenceMode inference;
  const ModelConfig c = preset(preset_name);
  const int64_t d = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  struct Shape {
    std::string name;
    int64_t out, in;
  };
  const std::vector<Shape> shapes = {{"q_proj", q, d},
                                     {"k_proj", kv, d},
                                     {"o_proj", d, q},
                                     {"gate_proj", c.intermediate_size, d},
                                     {"down_proj", d, c.intermediate_size},
                                     {"lm_head", c.vocab_size, d}};
  nlohmann::ordered_json rows = nlohmann::json::array();
  std::printf("decode-shaped linear, preset %s, fp32 CPU, %d threads (median of %d)\n", preset_name.c_str(),
              at::get_num_threads(), repeat);
  std::printf("  %-10s %5s %18s %14s %14s %8s\n", "weight", "rows", "shape", "at::linear GB/s", "streaming GB/s",
              "ratio");
  for (const Shape& s : shapes) {
    at::Tensor w = at::randn({s.out, s.in});
    const double gigabytes = static_cast<double>(w.numel()) * 4 / 1e9;
    for (int64_t m : row_counts) {
      at::Tensor x = at::randn({m, s.in});
      const double diff = (streaming_linear(x, w) - at::linear(x, w)).abs().max().item<double>();
      const double t_aten = median_seconds(repeat, [&] { at::linear(x, w); });
      const double t_stream = median_seconds(repeat, [&] { streaming_linear(x, w); });
      const std::string shape = std::to_string(s.out) + "x" + std::to_string(s.in);
      std::printf("  %-10s %5lld %18s %14.1f %14.1f %7.2fx\n", s.name.c_str(), (long long)m, shape.c_str(),
                  gigabytes / t_aten, gigabytes / t_stream, t_aten / t_stream);
      rows.push_back({{"weight", s.name},
                      {"rows", m},
                      {"out", s.out},
                      {"in", s.in},
                      {"aten_seconds", t_aten},
                      {"streaming_seconds", t_stream},
                      {"aten_gb_s", gigabytes / t_aten},
                      {"streaming_gb_s", gigabytes / t_stream},
                      {"speedup", t_aten / t_stream},
                      {"max_abs_diff", diff}});
    }
  }
  if (!out.empty()) {
    nlohmann::ordered_json result = {
        {"benchmark", "linear"}, {"preset", preset_name}, {"threads", at::get_num_threads()},
        {"dtype", "fp32"},       {"device", "cpu"},       {"repeat", repeat},
        {"results", rows}};
    std::ofstream(out) << result.dump(2) << "\n";
    std::printf("  wrote %s\n", out.c_str());
  }
  return 0;
}
