#include "archspace/config/choices.h"

#include <ATen/Context.h>

#include "archspace/util/error.h"

namespace archspace {

std::string listed_choices(const std::vector<std::string>& choices) {
  std::string s;
  for (size_t i = 0; i < choices.size(); ++i) s += (i ? ", " : "") + choices[i];
  return s;
}

namespace {

std::string listed(const std::vector<std::string>& choices) { return listed_choices(choices); }

[[noreturn]] void unknown(const std::string& where, const std::string& what, const std::string& text,
                          const std::string& choices) {
  throw Error((where.empty() ? "" : where + ": ") + "unknown " + what + " '" + text + "' (valid: " + choices + ")");
}

}  // namespace

const std::vector<std::string>& variant_choices() {
  static const std::vector<std::string> c = {"base", "siamese_depth"};
  return c;
}
const std::vector<std::string>& dtype_choices() {
  static const std::vector<std::string> c = {"fp32", "bf16"};
  return c;
}
const std::vector<std::string>& data_format_choices() {
  static const std::vector<std::string> c = {"tokens", "chat"};
  return c;
}
const std::vector<std::string>& quantization_choices() {
  static const std::vector<std::string> c = {"none", "int8"};
  return c;
}
const std::vector<std::string>& sharding_choices() {
  static const std::vector<std::string> c = {"none", "optimizer", "full"};
  return c;
}

const std::vector<std::string>& norm_topology_choices() {
  static const std::vector<std::string> c = [] {
    std::vector<std::string> names;
    for (NormTopology t : {NormTopology::kReordered, NormTopology::kPre, NormTopology::kPeri, NormTopology::kPost,
                           NormTopology::kDeepNorm, NormTopology::kHybrid, NormTopology::kResidual,
                           NormTopology::kSiameseHybridPre, NormTopology::kSiamesePostPre})
      names.push_back(norm_topology_name(t));
    return names;
  }();
  return c;
}

NormTopology parse_norm_topology(const std::string& text, const std::string& where) {
  const auto& names = norm_topology_choices();
  for (size_t i = 0; i < names.size(); ++i) {
    if (text == names[i]) return static_cast<NormTopology>(i);  // choices are listed in enum order
  }
  unknown(where, "norm_topology", text, listed(names));
}

Variant parse_variant(const std::string& text, const std::string& where) {
  if (text == "base") return Variant::kBase;
  if (text == "siamese_depth") return Variant::kSiameseDepth;
  unknown(where, "variant", text, listed(variant_choices()));
}

DType parse_dtype(const std::string& text, const std::string& where) {
  if (text == "fp32" || text == "float32") return DType::kFp32;
  if (text == "bf16" || text == "bfloat16") return DType::kBf16;
  unknown(where, "dtype", text, listed(dtype_choices()));
}

DataFormat parse_data_format(const std::string& text, const std::string& where) {
  if (text == "tokens") return DataFormat::kTokens;
  if (text == "chat") return DataFormat::kChat;
  unknown(where, "data format", text, listed(data_format_choices()));
}

Quantization parse_quantization(const std::string& text, const std::string& where) {
  if (text == "none") return Quantization::kNone;
  if (text == "int8") return Quantization::kInt8;
  unknown(where, "quantization", text, listed(quantization_choices()));
}

Sharding parse_sharding(const std::string& text, const std::string& where) {
  const auto& names = sharding_choices();
  for (size_t i = 0; i < names.size(); ++i) {
    if (text == names[i]) return static_cast<Sharding>(i);  // choices are listed in enum order
  }
  unknown(where, "sharding", text, listed(names));
}

DeviceSpec parse_device(const std::string& text, const std::string& where) {
  if (text == "cpu") return {DeviceKind::kCpu, -1};
  if (text == "cuda") return {DeviceKind::kCuda, -1};
  if (text.rfind("cuda:", 0) == 0) {
    const std::string n = text.substr(5);
    if (!n.empty() && n.size() <= 3 && n.find_first_not_of("0123456789") == std::string::npos)
      return {DeviceKind::kCuda, std::stoi(n)};
  }
  unknown(where, "device", text, "cpu, cuda, cuda:N");
}

at::Device DeviceSpec::device() const {
  if (kind == DeviceKind::kCpu) return at::kCPU;
  if (!at::hasCUDA()) throw Error("device " + name() + ": this machine has no CUDA device");
  return index < 0 ? at::Device(at::kCUDA) : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

std::string DeviceSpec::name() const {
  if (kind == DeviceKind::kCpu) return "cpu";
  return index < 0 ? "cuda" : "cuda:" + std::to_string(index);
}

const char* dtype_name(DType d) { return d == DType::kFp32 ? "fp32" : "bf16"; }
const char* quantization_name(Quantization q) { return q == Quantization::kNone ? "none" : "int8"; }
const char* data_format_name(DataFormat f) { return f == DataFormat::kTokens ? "tokens" : "chat"; }
const char* sharding_name(Sharding s) {
  return s == Sharding::kNone ? "none" : s == Sharding::kOptimizer ? "optimizer" : "full";
}
at::ScalarType scalar_type(DType d) { return d == DType::kFp32 ? at::kFloat : at::kBFloat16; }

}  // namespace archspace
