// Decode-shaped matrix products: the engine's streaming kernel (kernels/linear) against at::linear, on the
// weight shapes of a preset, for 1 and 4 rows, fp32, bf16 or int8 weights (--dtype; int8: kernels/int8_weights,
// fp32 activations, its at::linear column the fp32 GEMV on the unquantized weight), CPU. Reports GB/s of weights read
// and the ratio (at::linear time / streaming time: > 1 means the kernel is faster), the median of --repeat timings, and
// checks the two results agree. With --dtype bf16 or int8 it also times the fp32 streaming kernel on the same shape,
// side by side: "vs fp32" is fp32 streaming time / this dtype's streaming time (2 for bf16, 4 for int8 would be all of
// the saved bytes). JSON to bench/results/linear-<time>.json (--out), a table on stdout. A weight that fits in the
// last-level cache stays there across repeats, so its GB/s can exceed memory bandwidth; in a real decode step the 12
// layers' weights do not fit, and the lm_head row (hundreds of MB) is the memory-bound case. The last row, "step",
// is that case whole: every layer's seven weights and the head, distinct tensors in the order a decode step reads
// them (each of --rows rows of x: 8 is a serving step under 8 clients), timed together, so the weights come from memory
// and each call pays its start-up as in decoding; its at::linear column is left out (fp32 weights of a whole model
// twice over are not worth the memory).
//
//     build/bench_linear [--preset 190M] [--threads N] [--repeat 20] [--rows 1,4] [--dtype fp32|bf16|int8]
//                        [--shapes all|step] [--int8-x fp32|bf16] [--out FILE]
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
#include "archspace/kernels/cpu_isa.h"
#include "archspace/kernels/int8_weights.h"
#include "archspace/kernels/linear.h"
#include "archspace/util/malloc_policy.h"

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
  use_huge_pages_for_large_tensors();  // as the engine's own main does
  std::string preset_name = "190M", out, dtype_name = "fp32", which_shapes = "all", int8_x = "fp32";
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
    else if (flag == "--dtype" && (value == "fp32" || value == "bf16" || value == "int8"))
      dtype_name = value;
    else if (flag == "--int8-x" && (value == "fp32" || value == "bf16"))
      int8_x = value;
    else if (flag == "--shapes" && (value == "all" || value == "step"))
      which_shapes = value;
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
  const bool bf16 = dtype_name == "bf16", int8 = dtype_name == "int8", narrow = bf16 || int8;
  // of x (and of W unless int8); int8 weights take fp32 x, or bf16 with --int8-x bf16 (as `--dtype bf16
  // --quantization int8` decodes)
  const at::ScalarType dtype = bf16 || (int8 && int8_x == "bf16") ? at::kBFloat16 : at::kFloat;
  nlohmann::ordered_json rows = nlohmann::json::array();
  std::printf("decode-shaped linear, preset %s, %s CPU, %d threads, kernel path %s (median of %d)\n",
              preset_name.c_str(), (dtype_name + (int8 ? " (x " + int8_x + ")" : "")).c_str(), at::get_num_threads(),
              cpu_isa_name(max_cpu_isa()), repeat);
  std::printf("  %-10s %5s %18s %14s %14s %8s%s\n", "weight", "rows", "shape", "at::linear GB/s", "streaming GB/s",
              "ratio", narrow ? "  fp32 streaming GB/s  vs fp32" : "");
  for (const Shape& s : shapes) {
    if (which_shapes == "step") break;
    at::Tensor w32 = at::randn({s.out, s.in});
    at::Tensor w = int8 ? quantize_int8_rows(w32, s.name) : w32.to(dtype);
    const at::Tensor w_aten = int8 ? w32.to(dtype) : w;  // at::linear has no int8-weight GEMV: x's dtype's
    const auto stream = [&](const at::Tensor& x) {
      return int8 ? int8_streaming_linear(x, w) : streaming_linear(x, w);
    };
    const double gigabytes = static_cast<double>(w.numel()) * (int8 ? 1 : w.element_size()) / 1e9;
    const double aten_gigabytes = static_cast<double>(w_aten.numel()) * w_aten.element_size() / 1e9;
    for (int64_t m : row_counts) {
      at::Tensor x32 = at::randn({m, s.in});
      at::Tensor x = x32.to(dtype);
      const at::Tensor w_ref = int8 ? dequantize_int8_rows(w, dtype) : w;  // what the kernel multiplies by
      const double diff = (stream(x) - at::linear(x, w_ref)).abs().max().item<double>();
      const double t_aten = median_seconds(repeat, [&] { at::linear(x, w_aten); });
      const double t_stream = median_seconds(repeat, [&] { stream(x); });
      const double t_fp32 = narrow ? median_seconds(repeat, [&] { streaming_linear(x32, w32); }) : t_stream;
      const std::string shape = std::to_string(s.out) + "x" + std::to_string(s.in);
      std::printf("  %-10s %5lld %18s %14.1f %14.1f %7.2fx", s.name.c_str(), (long long)m, shape.c_str(),
                  aten_gigabytes / t_aten, gigabytes / t_stream, t_aten / t_stream);
      if (narrow)
        std::printf("  %20.1f %6.2fx", 4 * static_cast<double>(w32.numel()) / 1e9 / t_fp32, t_fp32 / t_stream);
      std::printf("\n");
      nlohmann::ordered_json row = {{"weight", s.name},
                                    {"rows", m},
                                    {"out", s.out},
                                    {"in", s.in},
                                    {"aten_seconds", t_aten},
                                    {"streaming_seconds", t_stream},
                                    {"aten_gb_s", aten_gigabytes / t_aten},
                                    {"streaming_gb_s", gigabytes / t_stream},
                                    {"speedup", t_aten / t_stream},
                                    {"max_abs_diff", diff}};
      if (narrow) {
        row["fp32_streaming_seconds"] = t_fp32;
        row["speedup_vs_fp32_streaming"] = t_fp32 / t_stream;
      }
      rows.push_back(row);
    }
  }
  {
    // One decode step's weights in reading order: q, k, v, o, gate, up, down per layer, then the head.
    std::vector<Shape> step_shapes;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      for (const Shape& s : {Shape{"q", q, d}, Shape{"k", kv, d}, Shape{"v", kv, d}, Shape{"o", d, q},
                             Shape{"gate", c.intermediate_size, d}, Shape{"up", c.intermediate_size, d},
                             Shape{"down", d, c.intermediate_size}})
        step_shapes.push_back(s);
    }
    step_shapes.push_back(shapes.back());
    std::vector<at::Tensor> ws, ws32;
    double weights = 0;
    for (const Shape& s : step_shapes) {
      at::Tensor w32 = at::randn({s.out, s.in});
      ws.push_back(int8 ? quantize_int8_rows(w32, s.name) : w32.to(dtype));
      if (narrow) ws32.push_back(w32);
      weights += static_cast<double>(w32.numel());
    }
    const double gigabytes = weights * (int8 ? 1 : bf16 ? 2 : 4) / 1e9;
    // Each row count of --rows: 1 is batch-1 decoding, 8 a serving step under 8 clients.
    for (int64_t m : row_counts) {
      std::vector<at::Tensor> xs, xs32;
      for (const Shape& s : step_shapes) {
        xs32.push_back(at::randn({m, s.in}));
        xs.push_back(xs32.back().to(dtype));
      }
      const double t_stream = median_seconds(repeat, [&] {
        for (size_t i = 0; i < ws.size(); ++i)
          int8 ? int8_streaming_linear(xs[i], ws[i]) : streaming_linear(xs[i], ws[i]);
      });
      const double t_fp32 = narrow ? median_seconds(repeat,
                                                    [&] {
                                                      for (size_t i = 0; i < ws32.size(); ++i)
                                                        streaming_linear(xs32[i], ws32[i]);
                                                    })
                                   : t_stream;
      std::printf("  %-10s %5lld %17.0fM %14s %14.1f %8s", "step", (long long)m, weights / 1e6, "-",
                  gigabytes / t_stream, "-");
      if (narrow) std::printf("  %20.1f %6.2fx", 4 * weights / 1e9 / t_fp32, t_fp32 / t_stream);
      std::printf("   (%.2f ms a step, %.0f GFLOP/s)\n", 1e3 * t_stream, 2 * weights * m / 1e9 / t_stream);
      nlohmann::ordered_json row = {{"weight", "step"},
                                    {"rows", m},
                                    {"weights", weights},
                                    {"streaming_seconds", t_stream},
                                    {"streaming_gb_s", gigabytes / t_stream},
                                    {"streaming_gflop_s", 2 * weights * m / 1e9 / t_stream}};
      if (narrow) {
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
