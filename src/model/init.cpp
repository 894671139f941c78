#include "archspace/model/init.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "archspace/model/parameters.h"

namespace archspace {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Megatron's output_layer_init_method applies to each sublayer's output projection (linear_proj, linear_fc2).
bool megatron_output_projection(const std::string& name) {
  return ends_with(name, ".self_attn.o_proj.weight") || ends_with(name, ".mlp.down_proj.weight");
}

CausalLM megatron_init(const ModelConfig& config, uint64_t seed, at::ScalarType dtype, at::Device device) {
  const double std_dev = 0.02;
  const double output_std = std_dev / std::sqrt(2.0 * static_cast<double>(config.num_hidden_layers));
  return model_from_draws(config, seed, dtype, device, [&](at::Tensor& t, const ParamSpec& spec, at::Generator& gen) {
    t.normal_(0.0, megatron_output_projection(spec.name) ? output_std : std_dev, gen);
  });
}

}  // namespace

CausalLM model_from_draws(const ModelConfig& config, uint64_t seed, at::ScalarType dtype, at::Device device,
                          const InitFill& fill) {
  config.validate();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  NamedTensors params;
  for (const auto& spec : parameter_specs(config)) {
    at::Tensor t;
    if (spec.kind == ParamKind::kNorm) {
      t = at::ones(spec.shape, at::kFloat);
    } else {
      t = at::empty(spec.shape, at::kFloat);
      fill(t, spec, gen);
      if (spec.init_scale != 1.0) t.mul_(spec.init_scale);
    }
    params.emplace_back(spec.name, t.to(device, dtype));
  }
  return CausalLM(config, std::move(params));
}

CausalLM initialised_model(const ModelConfig& config, uint64_t seed, InitScheme scheme, at::ScalarType dtype,
                           at::Device device) {
  if (scheme == InitScheme::kMegatron) return megatron_init(config, seed, dtype, device);
  return CausalLM::random_init(config, seed, dtype, device);
}

}  // namespace archspace
