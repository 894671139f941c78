#include "archspace/model/model_io.h"

#include <filesystem>
#include <set>

#include "archspace/kernels/int8_weights.h"
#include "archspace/util/error.h"

namespace archspace {

namespace fs = std::filesystem;

ModelConfig load_model_config(const std::string& dir) {
  if (!fs::is_directory(dir)) throw Error(dir + ": not a model directory");
  const fs::path path = fs::path(dir) / "config.json";
  if (!fs::exists(path)) throw Error(dir + ": no config.json in the model directory");
  return ModelConfig::load(path.string());
}

void check_weights(const ModelConfig& config, const TensorStore& store, const std::string& dir) {
  std::vector<std::string> missing, unexpected, misshaped, bad_dtype;
  std::set<std::string> expected;
  for (const auto& spec : parameter_specs(config)) {
    expected.insert(spec.name);
    if (!store.contains(spec.name)) {
      missing.push_back(spec.name);
      continue;
    }
    const TensorInfo& info = store.info(spec.name);
    if (info.shape != spec.shape) {
      misshaped.push_back(spec.name + " (file " + shape_string(info.shape) + ", model " + shape_string(spec.shape) +
                          ")");
    }
    if (info.dtype != "F32" && info.dtype != "BF16" && info.dtype != "F16") {
      bad_dtype.push_back(spec.name + " (" + info.dtype + ")");
    }
  }
  for (const auto& name : store.names()) {
    if (!expected.count(name)) unexpected.push_back(name);
  }
  if (missing.empty() && unexpected.empty() && misshaped.empty() && bad_dtype.empty()) return;

  auto list = [](const std::string& title, const std::vector<std::string>& items) {
    std::string s;
    if (items.empty()) return s;
    s += "\n  " + std::to_string(items.size()) + " " + title + ":";
    for (const auto& i : items) s += "\n    " + i;
    return s;
  };
  throw Error(dir + ": the weights do not match the " + variant_name(config.variant) + " (" +
              model_type_name(config.variant) + ") model described by config.json:" + list("missing", missing) +
              list("unexpected", unexpected) + list("mis-shaped", misshaped) +
              list("not a float dtype (F32, BF16, F16)", bad_dtype));
}

CausalLM load_model(const std::string& dir, const LoadOptions& options) {
  ModelConfig config = load_model_config(dir);
  TensorStore store = TensorStore::open_dir(dir);
  check_weights(config, store, dir);
  const bool int8 = options.quantization == Quantization::kInt8;
  if (int8 && !options.device.is_cpu()) {
    throw Error("int8 weights (--quantization int8) run on the CPU only, not on " + options.device.str());
  }
  NamedTensors params;
  for (const auto& spec : parameter_specs(config)) {
    if (int8 && spec.kind == ParamKind::kLinear) {  // read from the mapping a block of rows at a time
      params.emplace_back(spec.name, quantize_int8_rows(store.tensor(spec.name),
                                                        store.file_of(spec.name) + ": tensor '" + spec.name + "'"));
      continue;
    }
    // copy=true: never keep a view of the read-only mapping as a parameter.
    params.emplace_back(spec.name, store.tensor(spec.name).to(options.device, options.dtype, false, /*copy=*/true));
    if (!options.allow_nonfinite && !at::isfinite(params.back().second).all().item<bool>()) {
      const at::Tensor& t = params.back().second;
      const int64_t nan = at::isnan(t).sum().item<int64_t>(), inf = at::isinf(t).sum().item<int64_t>();
      throw Error(store.file_of(spec.name) + ": tensor '" + spec.name + "' holds " + std::to_string(nan) + " NaN and " +
                  std::to_string(inf) +
                  " infinite values (a diverged or corrupt checkpoint; --allow-nonfinite loads it anyway)");
    }
  }
  return CausalLM(std::move(config), std::move(params));
}

void save_model(const CausalLM& model, const std::string& dir, at::ScalarType dtype, uint64_t max_shard_bytes) {
  fs::create_directories(dir);
  NamedTensors out;
  for (const auto& [name, t] : model.parameters())
    out.emplace_back(name, is_int8_weight(t) ? dequantize_int8_rows(t, dtype) : t.to(at::kCPU, dtype));
  save_model_weights(dir, out, max_shard_bytes);
  model.config().save((fs::path(dir) / "config.json").string());
}

}  // namespace archspace
