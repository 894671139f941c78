// check_attention: the flash attention path against the reference attention, forward and backward, as
// one JSON line on stdout (scripts/device_check.py runs it). On CUDA it runs LibTorch's flash kernel
// with the window this engine passes; with --device cpu the kernel's CPU stand-in takes its place, so
// the dry run in CI runs this same program over the same layouts and arguments. Cases with "documents"
// run document masking (train.document_masking): the kernel's variable-length form over the documents'
// cu_seqlens against the reference's block-diagonal mask.
//
// Inputs are bf16 (as under autocast); the reference is the fp32 attention of the same bf16 values, and
// its gradients are taken in fp32 too. Tolerances, relative to the largest entry of the reference (bf16
// keeps 8 significant bits: rounding one value moves it by at most 2^-9 = 0.2% of itself): the output
// within 1% (its rounding to bf16, seen 0.2-0.3% through the CPU stand-in, plus the kernel's own order of
// summation in fp32); each gradient within 2% (the kernel's backward rounds P, dS and dO to bf16 for its
// matmuls). A wrong window, a misaligned causal mask or a wrong GQA head mapping moves outputs by an
// amount of the order of the values themselves.
//
// "decode_sdpa_backend": the kernel SDPA picks for one bf16 decoding query over 300 cached keys (GQA), once
// causal_attention has run on the device: on CUDA it must not be cuDNN's (avoid_cudnn_attention, model/attention.h).
#include <ATen/SDPBackend.h>

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "archspace/model/attention.h"
#include "archspace/model/documents.h"

using namespace archspace;

namespace {

const char* backend_name(int64_t choice) {
  switch (static_cast<at::SDPBackend>(choice)) {
    case at::SDPBackend::math:
      return "math";
    case at::SDPBackend::flash_attention:
      return "flash_attention";
    case at::SDPBackend::efficient_attention:
      return "efficient_attention";
    case at::SDPBackend::cudnn_attention:
      return "cudnn_attention";
    case at::SDPBackend::overrideable:
      return "overrideable";
    default:
      return "error";
  }
}

// The SDPA kernel of a decoding step (the engine's kSdpaNoMask path) after the engine ran attention on `device`.
std::string decode_sdpa_backend(const at::Device& device) {
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(device);
  at::Tensor q = at::randn({1, 16, 1, 64}, opts), k = at::randn({1, 8, 300, 64}, opts), v = at::randn_like(k);
  causal_attention(q, k, v, /*window=*/0, /*q_offset=*/299, AttentionImpl::kSdpa);
  return backend_name(at::_fused_sdp_choice(q, k, v, {}, 0.0, false, 1.0 / 8.0, /*enable_gqa=*/true));
}

struct Result {
  double forward = 0, dq = 0, dk = 0, dv = 0;
};

double relative(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>() /
         std::max(b.abs().max().item<double>(), 1e-30);
}

// The documents of rows of the given lengths (each but a row's last ended by EOS id 0), found as training
// finds them, on `device`.
Documents documents_of(const std::vector<std::vector<int64_t>>& rows, at::Device device) {
  std::vector<at::Tensor> out;
  for (const auto& lengths : rows) {
    int64_t T = 0;
    for (int64_t n : lengths) T += n;
    at::Tensor row = at::ones({T}, at::kLong);
    int64_t end = 0;
    for (size_t i = 0; i + 1 < lengths.size(); ++i) row[(end += lengths[i]) - 1] = 0;
    out.push_back(row);
  }
  return find_documents(at::stack(out).to(device), 0);
}

Result check(at::Device device, int64_t B, int64_t H, int64_t G, int64_t T, int64_t h, int64_t window,
             const Documents* documents = nullptr) {
  const bool stand_in = !device.is_cuda();
  auto opts = at::TensorOptions().device(device);
  at::Tensor q = at::randn({B, H, T, h}, opts).to(at::kBFloat16), k = at::randn({B, G, T, h}, opts).to(at::kBFloat16),
             v = at::randn({B, G, T, h}, opts).to(at::kBFloat16);
  at::Tensor upstream = at::randn({B, H, T, h}, opts);
  Result r;
  at::Tensor out_flash, out_ref;
  std::vector<at::Tensor> g_flash, g_ref;
  for (int which = 0; which < 2; ++which) {
    at::Tensor qq = (which == 0 ? q : q.to(at::kFloat)).detach().requires_grad_(true);
    at::Tensor kk = (which == 0 ? k : k.to(at::kFloat)).detach().requires_grad_(true);
    at::Tensor vv = (which == 0 ? v : v.to(at::kFloat)).detach().requires_grad_(true);
    at::Tensor out = which == 0 ? flash_causal_attention(qq, kk, vv, window, stand_in, documents)
                                : causal_attention(qq, kk, vv, window, 0, AttentionImpl::kReference, {}, documents);
    (out.to(at::kFloat) * upstream).sum().backward();
    (which == 0 ? out_flash : out_ref) = out.detach();
    (which == 0 ? g_flash : g_ref) = {qq.grad(), kk.grad(), vv.grad()};
  }
  r.forward = relative(out_flash, out_ref);
  r.dq = relative(g_flash[0], g_ref[0]);
  r.dk = relative(g_flash[1], g_ref[1]);
  r.dv = relative(g_flash[2], g_ref[2]);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = "cuda";
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--device") == 0) device_name = argv[i + 1];
  const at::Device device(device_name);
  at::manual_seed(0);
  // (T, window): sliding layers with T > 2 window (today blocked), T within 2 windows, a window at
  // least T (plain causal), and a full layer; GQA 8 query heads over 2 kv heads, head size 64.
  const bool small = !device.is_cuda();
  const std::vector<std::pair<int64_t, int64_t>> cases =
      small ? std::vector<std::pair<int64_t, int64_t>>{{40, 8}, {24, 16}, {20, 32}, {33, 0}}
            : std::vector<std::pair<int64_t, int64_t>>{{4096, 1024}, {1536, 1024}, {1000, 4096}, {2048, 0}};
  const double tol_forward = 1e-2, tol_grad = 2e-2;  // relative to the reference's largest entry
  nlohmann::json rows = nlohmann::json::array();
  bool ok = true;
  auto record = [&](int64_t T, int64_t window, const Result& r, const nlohmann::json& documents) {
    const bool pass = r.forward <= tol_forward && r.dq <= tol_grad && r.dk <= tol_grad && r.dv <= tol_grad;
    ok = ok && pass;
    nlohmann::json row = {{"T", T},         {"window", window}, {"forward_rel", r.forward},
                          {"dq_rel", r.dq}, {"dk_rel", r.dk},   {"dv_rel", r.dv},
                          {"pass", pass}};
    if (!documents.is_null()) row["documents"] = documents;
    rows.push_back(row);
  };
  for (auto [T, window] : cases) record(T, window, check(device, 2, 8, 2, T, 64, window), nullptr);
  // Document masking: per row, the document lengths (a one-token document, documents shorter and longer than
  // the window, a row that is one document), with a sliding window and a full layer.
  struct DocumentCase {
    int64_t window;
    std::vector<std::vector<int64_t>> rows;
  };
  const std::vector<DocumentCase> document_cases =
      small ? std::vector<DocumentCase>{{8, {{5, 20, 15}, {40}}}, {0, {{1, 16, 23}, {30, 10}}}}
            : std::vector<DocumentCase>{{1024, {{700, 2500, 896}, {4096}}},
                                        {0, {{1, 1000, 3095}, {2048, 2048}}},
                                        {4096, {{3000, 1096}, {17, 4079}}}};
  for (const auto& dc : document_cases) {
    const Documents documents = documents_of(dc.rows, device);
    record(documents.length, dc.window, check(device, 2, 8, 2, documents.length, 64, dc.window, &documents), dc.rows);
  }
  const std::string decode_backend = decode_sdpa_backend(device);
  ok = ok && decode_backend != "cudnn_attention" && decode_backend != "error";
  nlohmann::json j = {{"device", device.str()},
                      {"kernel", device.is_cuda() ? "at::_flash_attention_forward" : "cpu stand-in"},
                      {"tolerance", {{"forward_rel", tol_forward}, {"grad_rel", tol_grad}}},
                      {"cases", rows},
                      {"decode_sdpa_backend", decode_backend},
                      {"pass", ok}};
  std::printf("%s\n", j.dump().c_str());
  return ok ? 0 : 1;
}
