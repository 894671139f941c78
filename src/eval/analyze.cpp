#include "archspace/eval/analyze.h"

#include <c10/core/InferenceMode.h>

#include <cmath>
#include <map>
#include <optional>
#include <regex>

#include "archspace/kernels/bf16_matmuls.h"
#include "archspace/model/depth_attention.h"
#include "archspace/model/loss.h"
#include "archspace/model/rms_norm.h"
#include "archspace/model/trace.h"
#include "archspace/util/error.h"

namespace archspace {
using nlohmann::json;

namespace {

// The per-layer outputs that are residual streams (model/trace.h names): one stream for single-stream
// topologies, X (post-norm-like) and Y (pre-norm-like) for SiameseNorm.
const char* const kStreams[] = {"hidden", "X", "Y"};

std::optional<at::Tensor> find_parameter(const CausalLM& model, const std::string& name) {
  for (const auto& [n, t] : model.parameters()) {
    if (n == name) return t;
  }
  return std::nullopt;
}

double rms(const at::Tensor& t) { return t.to(at::kDouble).pow(2).mean().sqrt().item<double>(); }

// The final norms a stream goes through before the head (the logit lens reads each stream this way).
std::vector<at::Tensor> lens_norms(const CausalLM& model, const std::string& stream) {
  std::vector<at::Tensor> norms;
  if (stream == "X") norms.push_back(model.parameter("model.siamese_post_final_layernorm.weight"));
  if (stream == "Y") norms.push_back(model.parameter("model.siamese_pre_final_layernorm.weight"));
  norms.push_back(model.parameter("model.norm.weight"));
  return norms;
}

// Mean next-token cross-entropy of hidden states [N, T, d] (already through the final norms) against tokens.
double next_token_loss(const CausalLM& model, const at::Tensor& final_hidden, const at::Tensor& tokens, int64_t chunk) {
  const int64_t N = tokens.size(0), T = tokens.size(1);
  const at::Tensor h = final_hidden.narrow(1, 0, T - 1);
  const at::Tensor targets = tokens.narrow(1, 1, T - 1).to(h.device());
  const LossSums sums = head_loss(h, model.head_weight(), targets, 0, chunk);
  return sums.ce_sum.item<double>() / static_cast<double>(N * (T - 1));
}

// The most likely token at every position of hidden states [N, T, d] (already through the final norms): [N*T].
// `head` is the model's head weight, kept for every call (widened once where bf16 matmuls are: kernels/bf16_matmuls.h).
at::Tensor argmax_tokens(const bf16_matmuls::Operand& head, const at::Tensor& final_hidden, int64_t chunk) {
  const at::Tensor h = final_hidden.reshape({-1, final_hidden.size(-1)});
  std::vector<at::Tensor> parts;
  for (int64_t start = 0; start < h.size(0); start += chunk) {
    parts.push_back(
        bf16_matmuls::linear(h.narrow(0, start, std::min(chunk, h.size(0) - start)), head).argmax(-1).cpu());
  }
  return at::cat(parts);
}

at::Tensor through(const at::Tensor& x, const std::vector<at::Tensor>& norms, double eps) {
  at::Tensor y = x;
  for (const auto& w : norms) y = rms_norm(y, w, eps);
  return y;
}

// The recorded residual streams, per layer, and the embeddings (model/trace.h names).
struct RecordedStreams {
  std::map<std::string, std::vector<at::Tensor>> per_layer;  // stream name -> per layer
  at::Tensor embeddings;
};

RecordedStreams recorded_streams(const ActivationRecorder& recorder) {
  RecordedStreams out;
  const std::regex layer_name(R"(model\.layers\.(\d+)\.(\w+))");
  for (const auto& [name, t] : recorder.tensors) {
    if (name == "model.embeddings") out.embeddings = t;
    std::smatch m;
    if (!std::regex_match(name, m, layer_name)) continue;
    for (const char* s : kStreams) {
      if (m[2] == s) out.per_layer[s].push_back(t);
    }
  }
  return out;
}

// What the analysis reads through the head: the token ids, the head and its chunk, the output's own top tokens.
struct Lens {
  const CausalLM& model;
  const at::Tensor& tokens;
  const bf16_matmuls::Operand& head;
  const at::Tensor& output_argmax;
  int64_t chunk;
};

// Per stream: hidden-state norm per layer (mean L2 norm of a token's vector; the embeddings first), and the logit
// lens (how often the stream's most likely token is the output's, and the lens's own loss). `lens_argmax` gets each
// stream's top tokens per layer.
json stream_norms_and_lens(const Lens& lens, const RecordedStreams& streams,
                           std::map<std::string, std::vector<at::Tensor>>& lens_argmax) {
  const double eps = lens.model.config().rms_norm_eps;
  json out = json::object();
  for (const auto& [name, per_layer] : streams.per_layer) {
    json s;
    s["norm"] = json::array({streams.embeddings.to(at::kFloat).norm(2, -1).mean().item<double>()});
    s["rms"] = json::array({rms(streams.embeddings)});
    const std::vector<at::Tensor> norms = lens_norms(lens.model, name);
    for (const auto& h : per_layer) {
      s["norm"].push_back(h.to(at::kFloat).norm(2, -1).mean().item<double>());
      s["rms"].push_back(rms(h));
      const at::Tensor lensed = through(h, norms, eps);
      const at::Tensor top = argmax_tokens(lens.head, lensed, lens.chunk);
      lens_argmax[name].push_back(top);
      s["lens_agreement"].push_back(top.eq(lens.output_argmax).to(at::kDouble).mean().item<double>());
      s["lens_loss"].push_back(next_token_loss(lens.model, lensed, lens.tokens, lens.chunk));
    }
    out[name] = s;
  }
  return out;
}

// Where the two SiameseNorm streams' lenses disagree: how often each one has the output's token.
json stream_disagreement(const std::vector<at::Tensor>& x_top, const std::vector<at::Tensor>& y_top,
                         const at::Tensor& output_argmax) {
  json d = json::array();
  for (int64_t l = 0; l < static_cast<int64_t>(x_top.size()); ++l) {
    const at::Tensor& x = x_top[l];
    const at::Tensor& y = y_top[l];
    const at::Tensor differ = x.ne(y);
    const int64_t n = differ.sum().item<int64_t>();
    json row = {{"layer", l}, {"fraction", differ.to(at::kDouble).mean().item<double>()}, {"positions", n}};
    if (n > 0) {
      row["X_agrees"] = x.eq(output_argmax).logical_and(differ).sum().item<double>() / static_cast<double>(n);
      row["Y_agrees"] = y.eq(output_argmax).logical_and(differ).sum().item<double>() / static_cast<double>(n);
    }
    d.push_back(row);
  }
  return d;
}

// Each layer's 1-D weights (the norms and scales), as their mean absolute value.
json norm_weights_mean_abs(const CausalLM& model) {
  json norms = json::array();
  for (int64_t l = 0; l < model.config().num_hidden_layers; ++l) {
    json row = json::object();
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    for (const auto& [name, t] : model.parameters()) {
      if (name.rfind(prefix, 0) == 0 && t.dim() == 1) row[name.substr(prefix.size())] = t.abs().mean().item<double>();
    }
    norms.push_back(row);
  }
  return norms;
}

std::optional<double> weight_rms(const CausalLM& model, const std::string& name) {
  auto w = find_parameter(model, name);
  if (!w) return std::nullopt;
  return rms(*w);
}

// Each summand of a SiameseNorm sublayer's fused input, as an estimated RMS: a normalised stream has unit RMS
// before its weight, so its summand's RMS is the weight's RMS; the X stream enters attention un-normalised
// (hybrid_pre: times siamese_hybrid_attn_scale), so its measured RMS counts there.
json input_intensity(const CausalLM& model, const RecordedStreams& streams) {
  json intensity = json::array();
  const std::vector<at::Tensor>& x_stream = streams.per_layer.at("X");
  for (int64_t l = 0; l < model.config().num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const at::Tensor x_in = l == 0 ? streams.embeddings : x_stream[l - 1];
    json row = {{"layer", l}};
    if (auto y = weight_rms(model, p + "siamese_attn_pre_norm.weight")) {
      const double scale = weight_rms(model, p + "siamese_hybrid_attn_scale").value_or(1.0);
      row["attn_Y"] = *y;
      row["attn_X"] = scale * rms(x_in);
    }
    if (auto y = weight_rms(model, p + "siamese_mlp_pre_norm.weight")) {
      row["mlp_Y"] = *y;
      auto x = weight_rms(model, p + "pre_mlp_layernorm.weight");
      if (!x) x = weight_rms(model, p + "post_attention_layernorm.weight");
      if (x) row["mlp_X"] = *x;
    }
    intensity.push_back(row);
  }
  return intensity;
}

// Depth-Attention: the mean mixing weight per source layer, for each layer that mixes.
json depth_attention_weights(const ModelConfig& c, const std::vector<at::Tensor>& depth_weights) {
  json depth = json::array();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!depth_weights[l].defined()) continue;
    std::vector<int64_t> sources = depth_sources(l, c.depth_attention_stride, c.depth_attention_recent_window);
    sources.push_back(l);  // the layer's own value comes last
    const at::Tensor mean = depth_weights[l].to(at::kDouble).reshape({-1, depth_weights[l].size(-1)}).mean(0).cpu();
    json w = json::object();
    for (size_t i = 0; i < sources.size(); ++i) w[std::to_string(sources[i])] = mean[i].item<double>();
    depth.push_back({{"layer", l}, {"weights", w}});
  }
  return depth;
}

}  // namespace

json analyze_model(const CausalLM& model, const at::Tensor& tokens, const AnalyzeOptions& options,
                   const std::function<void(int64_t, int64_t)>& progress) {
  const ModelConfig& c = model.config();
  if (tokens.dim() != 2 || tokens.size(1) < 2) throw Error("analyze: tokens must be [sequences, length >= 2]");
  c10::InferenceMode guard;
  const int64_t L = c.num_hidden_layers, total_forwards = 1 + L;
  const at::Tensor input = tokens.to(model.device());
  json out;
  out["sequences"] = tokens.size(0);
  out["sequence_length"] = tokens.size(1);
  out["layers"] = L;

  // One recorded forward: streams, logits, Depth-Attention weights.
  ActivationRecorder recorder;
  std::vector<at::Tensor> depth_weights;
  AnalysisOptions fwd;
  fwd.recorder = &recorder;
  fwd.depth_weights = &depth_weights;
  fwd.final_hidden_only = true;
  const at::Tensor final_hidden = model.forward(input, fwd);
  const double loss = next_token_loss(model, final_hidden, tokens, options.head_chunk);
  const bf16_matmuls::Operand head(model.head_weight());  // for every argmax_tokens below
  const at::Tensor output_argmax = argmax_tokens(head, final_hidden, options.head_chunk);
  out["loss"] = loss;
  if (progress) progress(1, total_forwards);

  const RecordedStreams streams = recorded_streams(recorder);
  std::map<std::string, std::vector<at::Tensor>> lens_argmax;
  out["streams"] =
      stream_norms_and_lens({model, tokens, head, output_argmax, options.head_chunk}, streams, lens_argmax);
  if (lens_argmax.count("X") && lens_argmax.count("Y"))
    out["stream_disagreement"] = stream_disagreement(lens_argmax["X"], lens_argmax["Y"], output_argmax);

  out["norm_weights_mean_abs"] = norm_weights_mean_abs(model);
  if (streams.per_layer.count("X")) out["input_intensity"] = input_intensity(model, streams);
  auto post = weight_rms(model, "model.siamese_post_final_layernorm.weight");
  auto pre = weight_rms(model, "model.siamese_pre_final_layernorm.weight");
  if (post && pre) out["fusion"] = {{"X", *post}, {"Y", *pre}, {"X_share", *post / (*post + *pre)}};
  if (json depth = depth_attention_weights(c, depth_weights); !depth.empty()) out["depth_attention"] = depth;

  // Layer pruning: one block removed at a time.
  json pruning = json::array();
  for (int64_t l = 0; l < L; ++l) {
    AnalysisOptions skip;
    skip.final_hidden_only = true;
    skip.skip_layer = l;
    const double pruned = next_token_loss(model, model.forward(input, skip), tokens, options.head_chunk);
    pruning.push_back({{"layer", l}, {"loss", pruned}, {"delta", pruned - loss}});
    if (progress) progress(2 + l, total_forwards);
  }
  out["pruning"] = pruning;
  return out;
}

}  // namespace archspace
