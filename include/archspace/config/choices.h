// The closed sets of choices that users spell as strings (flags, TOML keys): parsed here, once, into
// enums; every error names where the text came from and lists the valid choices.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

#include "archspace/config/model_config.h"

namespace archspace {

enum class DType { kFp32, kBf16 };
enum class DeviceKind { kCpu, kCuda };
enum class DataFormat { kTokens, kChat };  // pretraining token shards | SFT chat JSON Lines
// Data-parallel sharding (train.sharding): none (DDP: everything replicated), optimizer (ZeRO-1: the AdamW
// moments divided over the ranks), full (FSDP/ZeRO-3: parameters, gradients and moments divided).
enum class Sharding { kNone, kOptimizer, kFull };
// Weight-only quantization of the matmul weights for inference (--quantization; kernels/int8_weights.h): none,
// or int8 with one scale per output row.
enum class Quantization { kNone, kInt8 };

// A compute device as a user names it: "cpu", "cuda" or "cuda:N".
struct DeviceSpec {
  DeviceKind kind = DeviceKind::kCpu;
  int index = -1;             // cuda:N; -1: the current device
  at::Device device() const;  // throws when CUDA is asked for and absent
  std::string name() const;
};

// `where` names the flag or key ("--dtype", "run.toml: key 'train.dtype'") in errors.
Variant parse_variant(const std::string& text, const std::string& where);
DType parse_dtype(const std::string& text, const std::string& where);
DeviceSpec parse_device(const std::string& text, const std::string& where);
DataFormat parse_data_format(const std::string& text, const std::string& where);
NormTopology parse_norm_topology(const std::string& text, const std::string& where);
Sharding parse_sharding(const std::string& text, const std::string& where);
Quantization parse_quantization(const std::string& text, const std::string& where);

// The spellings accepted, for --help and CLI11 checks.
const std::vector<std::string>& variant_choices();        // base, siamese_depth
const std::vector<std::string>& dtype_choices();          // fp32, bf16
const std::vector<std::string>& data_format_choices();    // tokens, chat
const std::vector<std::string>& norm_topology_choices();  // reordered, pre, peri, ... (SPEC.md section 7)
const std::vector<std::string>& sharding_choices();       // none, optimizer, full
const std::vector<std::string>& quantization_choices();   // none, int8

std::string listed_choices(const std::vector<std::string>& choices);  // "a, b, c"

const char* dtype_name(DType d);  // "fp32" / "bf16"
const char* data_format_name(DataFormat f);
const char* sharding_name(Sharding s);
const char* quantization_name(Quantization q);
at::ScalarType scalar_type(DType d);

}  // namespace archspace
