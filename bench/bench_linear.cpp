// Decode-shaped matrix products: the engine's streaming kernel (model/linear) against at::linear, on the
// weight shapes of a preset, for 1 and 4 rows, fp32 or bf16 (--dtype), CPU. Reports GB/s of weights read and
// the ratio (at::linear time / streaming time: > 1 means the kernel is faster), the median of --repeat
// timings, and checks the two results agree. With --dtype bf16 it also times the fp32 streaming kernel on
// the same shape, side by side: "vs fp32" is fp32 streaming time / bf16 streaming time (2 would be all of
// the halved bytes). JSON to bench/results/linear-<time>.json (--out), a table on stdout.
// A weight that fits in the last-level cache stays there across repeats, so its GB/s can exceed memory
// bandwidth; in a real decode step the 12 layers' weights do not fit, and the lm_head row (hundreds of
// MB) is the memory-bound case.
//
//     build/bench_linear [--preset 190M] [--threads N] [--repeat 20] [--rows 1,4] [--dtype fp32|bf16] [--out FILE]
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
#include "archspace/util/cpu_isa.h"

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
  std::string preset_name = "190M", out, dtype_name = "fp32";
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
    else if (flag == "--dtype" && (value == "fp32" || value == "bf16"))
      dtype_name = value;
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
  const bool bf16 = dtype_name == "bf16";
  const at::ScalarType dtype = bf16 ? at::kBFloat16 : at::kFloat;
  nlohmann::ordered_json rows = nlohmann::json::array();
  std::printf("decode-shaped linear, preset %s, %s CPU, %d threads, kernel path %s (median of %d)\n",
              preset_name.c_str(), dtype_name.c_str(), at::get_num_threads(), cpu_isa_name(max_cpu_isa()), repeat);
  std::printf("  %-10s %5s %18s %14s %14s %8s%s\n", "weight", "rows", "shape", "at::linear GB/s", "streaming GB/s",
              "ratio", bf16 ? "  fp32 streaming GB/s  vs fp32" : "");
  for (const Shape& s : shapes) {
    at::Tensor w32 = at::randn({s.out, s.in});
    at::Tensor w = w32.to(dtype);
    const double gigabytes = static_cast<double>(w.numel()) * w.element_size() / 1e9;
    for (int64_t m : row_counts) {
      at::Tensor x32 = at::randn({m, s.in});
      at::Tensor x = x32.to(dtype);
      const double diff = (streaming_linear(x, w) - at::linear(x, w)).abs().max().item<double>();
      const double t_aten = median_seconds(repeat, [&] { at::linear(x, w); });
      const double t_stream = median_seconds(repeat, [&] { streaming_linear(x, w); });
      const double t_fp32 = bf16 ? median_seconds(repeat, [&] { streaming_linear(x32, w32); }) : t_stream;
      const std::string shape = std::to_string(s.out) + "x" + std::to_string(s.in);
      std::printf("  %-10s %5lld %18s %14.1f %14.1f %7.2fx", s.name.c_str(), (long long)m, shape.c_str(),
                  gigabytes / t_aten, gigabytes / t_stream, t_aten / t_stream);
      if (bf16) std::printf("  %20.1f %6.2fx", 2 * gigabytes / t_fp32, t_fp32 / t_stream);
      std::printf("\n");
      nlohmann::ordered_json row = {{"weight", s.name},
                                    {"rows", m},
                                    {"out", s.out},
                                    {"in", s.in},
                                    {"aten_seconds", t_aten},
                                    {"streaming_seconds", t_stream},
                                    {"aten_gb_s", gigabytes / t_aten},
                                    {"streaming_gb_s", gigabytes / t_stream},
                                    {"speedup", t_aten / t_stream},
                                    {"max_abs_diff", diff}};
      if (bf16) {
        row["fp32_streaming_seconds"] = t_fp32;
        row["speedup_vs_fp32_streaming"] = t_fp32 / t_stream;
      }
      rows.push_back(row);
    }
  }
  if (!out.empty()) {
    nlohmann::ordered_json result = {
        {"benchmark", "linear"}, {"preset", preset_name}, {"threads", at::get_num_threads()},
        {"dtype", dtype_name},   {"device", "cpu"},       {"repeat", repeat},
        {"results", rows}};
    std::ofstream(out) << result.dump(2) << "\n";
    std::printf("  wrote %s\n", out.c_str());
  }
  return 0;
}
