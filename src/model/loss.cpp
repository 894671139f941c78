#include "archspace/model/loss.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <string>

#include "archspace/kernels/bf16_gemm.h"
#include "archspace/kernels/bf16_matmuls.h"
#include "archspace/kernels/cross_entropy_rows.h"
#include "archspace/kernels/int8_weights.h"
#include "archspace/kernels/linear.h"
#include "archspace/util/error.h"

namespace archspace {

LossSums next_token_loss(const at::Tensor& logits, const at::Tensor& labels, double z_loss_coeff) {
  const int64_t V = logits.size(-1);
  at::Tensor flat = logits.reshape({-1, V});
  flat = flat.to(flat.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  at::Tensor target = labels.reshape({-1});
  at::Tensor valid = target != kIgnoreIndex;
  at::Tensor lse = at::logsumexp(flat, -1);
  at::Tensor picked = flat.gather(1, target.clamp_min(0).unsqueeze(1)).squeeze(1);
  at::Tensor mask = valid.to(flat.scalar_type());
  return {((lse - picked) * mask).sum(), (lse.pow(2) * mask).sum() * z_loss_coeff, valid.sum().item<int64_t>()};
}

namespace {

// The dtype the head's matmul runs in: autocast's where it is on for the device and would cast h (a
// floating tensor, not fp64), as at::linear's autocast wrapper decides; else the operands' own.
at::ScalarType matmul_dtype(const at::Tensor& h, const at::Tensor& w) {
  const c10::DeviceType device = h.device().type();
  if (at::autocast::is_autocast_enabled(device) && h.is_floating_point() && h.scalar_type() != at::kDouble)
    return at::autocast::get_autocast_dtype(device);
  if (h.scalar_type() != w.scalar_type()) {
    throw Error(std::string("head_loss: the hidden states are ") + c10::toString(h.scalar_type()) +
                " and the head weight " + c10::toString(w.scalar_type()) + " (without autocast they must match)");
  }
  return h.scalar_type();
}

// The logits, log-sum-exps and gradients are fp32 (fp64 for an fp64 check), whatever the matmul dtype.
at::ScalarType accumulate_dtype(at::ScalarType matmul) { return matmul == at::kDouble ? at::kDouble : at::kFloat; }

// One autograd node for the head's linear and the loss over chunks of the labelled rows.
//
// Recompute, not Liger's gradients-in-forward: Liger's fused linear cross-entropy forms grad_h [N, D] and
// grad_W [V, D] during the forward and keeps them until backward, which costs no extra matmul but keeps an
// fp32 [V, D] (783 MiB for the 1B head) and [N, D] from forward to backward, and it fixes the gradient's
// mix of the two outputs (cross-entropy and z-loss) before their output gradients are known. Keeping h, the
// labels and one log-sum-exp per row and recomputing each chunk's logits in backward keeps O(N) besides h
// (which the unchunked linear keeps too), works for any output gradients, and costs one [N, D] x [D, V]
// matmul more: a third of the head's unchunked forward + backward.
//
// With `pad_rows_to` > 1 and V not a multiple of it, the three matmuls run on the weight padded with zero rows
// to Vp (and the logits and their gradient padded to Vp columns, zero there): the same products for the real
// ids, plus exact zeros. Why: on CUDA a leading dimension of 100,278 (2 mod 8) keeps cuBLAS off its aligned
// kernels (the H200 profile: the head's three matmuls in sm80 `align2` CUTLASS kernels, 18% of the 1B step's
// GPU time at ~20% of the bf16 peak, the body's matmuls in Hopper kernels). The loss reads only the first V
// columns, through ATen's ops (the path CUDA always takes), so the padded ids never count.
struct ChunkedHeadLoss : torch::autograd::Function<ChunkedHeadLoss> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden,
                                                const at::Tensor& weight, const at::Tensor& weight_values,
                                                const at::Tensor& labels, double z_loss_coeff, int64_t chunk,
                                                int64_t pad_rows_to) {
    const at::ScalarType mm = matmul_dtype(hidden, weight), acc = accumulate_dtype(mm);
    // The casts are made here explicitly, as autocast would make them; nothing below may autocast again.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const int64_t D = hidden.size(-1);
    const at::Tensor h = hidden.detach().reshape({-1, D});
    const int64_t N = h.size(0);
    const at::Tensor target = labels.reshape({-1}).to(h.device(), at::kLong);
    const at::Tensor valid = target != kIgnoreIndex;
    const at::Tensor rows = valid.nonzero().squeeze(1);
    const int64_t n = rows.size(0);
    const bool all = n == N;
    // Only labelled rows go through the head (SFT masks most of a sequence).
    const at::Tensor hs = (all ? h : h.index_select(0, rows)).to(mm);
    // `weight_values`: the weight detached, or the caller's copy of it in the matmul dtype (made once per
    // optimizer step), which makes this cast a no-op.
    const at::Tensor w_real = weight_values.to(mm);
    const int64_t V = w_real.size(0), Vp = padded_head_rows(V, pad_rows_to);
    const bool padded = Vp != V;
    const at::Tensor w = padded ? at::constant_pad_nd(w_real, {0, 0, 0, Vp - V}) : w_real;
    const at::Tensor ts = all ? target : target.index_select(0, rows);
    at::Tensor lse = at::empty({n}, h.options().dtype(acc)), picked = at::empty({n}, h.options().dtype(acc));
    // One chunk keeps its logits (in the matmul dtype) for backward instead of computing them again.
    const bool keep_logits = n <= chunk;
    at::Tensor kept;
    const bf16_matmuls::Operand head(w);  // widened once for all chunks where bf16 matmuls are widened
    for (int64_t s = 0; s < n; s += chunk) {
      const int64_t c = std::min(chunk, n - s);
      const at::Tensor padded_logits = bf16_matmuls::linear(hs.narrow(0, s, c), head);
      const at::Tensor logits = padded ? padded_logits.narrow(1, 0, V) : padded_logits;
      const at::Tensor tc = ts.narrow(0, s, c);
      if (!padded && cross_entropy_rows_supported(logits)) {  // CPU: one pass over the logits as the matmul left them
        const RowLogSumExp rows = cross_entropy_rows(logits, tc);
        lse.narrow(0, s, c).copy_(rows.lse);
        picked.narrow(0, s, c).copy_(rows.picked);
      } else {
        const at::Tensor wide = logits.to(acc);
        lse.narrow(0, s, c).copy_(at::logsumexp(wide, -1));
        picked.narrow(0, s, c).copy_(wide.gather(1, tc.unsqueeze(1)).squeeze(1));
      }
      if (keep_logits) kept = padded_logits;
    }
    // The sums as next_token_loss forms them, over all N rows (zero where unlabelled): the same per-row
    // values give the same sums, bit for bit.
    const at::Tensor lse_all = all ? lse : at::zeros({N}, lse.options()).index_copy_(0, rows, lse);
    const at::Tensor picked_all = all ? picked : at::zeros({N}, lse.options()).index_copy_(0, rows, picked);
    const at::Tensor mask = valid.to(acc);
    const at::Tensor ce = ((lse_all - picked_all) * mask).sum();
    const at::Tensor z = (lse_all.pow(2) * mask).sum() * z_loss_coeff;

    ctx->save_for_backward({hs, w, ts, all ? at::Tensor() : rows, lse, kept});
    ctx->saved_data["z"] = z_loss_coeff;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["vocab"] = V;
    ctx->saved_data["shape"] = hidden.sizes().vec();
    ctx->saved_data["h_dtype"] = hidden.scalar_type();
    ctx->saved_data["w_dtype"] = weight.scalar_type();
    return {ce, z};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &hs = saved[0], &w = saved[1], &ts = saved[2], &rows = saved[3], &lse = saved[4];
    // The kept chunk is overwritten by its gradient: a second backward over a retained graph computes it again.
    at::Tensor kept = ctx->saved_data.count("consumed") ? at::Tensor() : saved[5];
    ctx->saved_data["consumed"] = true;
    const double z_loss_coeff = ctx->saved_data["z"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
    const at::ScalarType h_dtype = ctx->saved_data["h_dtype"].toScalarType();
    const at::ScalarType w_dtype = ctx->saved_data["w_dtype"].toScalarType();
    const at::ScalarType mm = hs.scalar_type(), acc = lse.scalar_type();
    // V real ids; w holds Vp >= V rows (zero beyond V: see pad_rows_to above).
    const int64_t n = hs.size(0), D = hs.size(1), Vp = w.size(0), V = ctx->saved_data["vocab"].toInt();
    const bool padded = Vp != V;
    const bool need_h = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);

    // d(ce_sum)/d(logits) = g_ce (softmax - onehot(label)); d(z_sum)/d(logits) = g_z coeff 2 lse softmax.
    const at::Tensor g_ce = grads[0].to(acc), g_z2 = grads[1].to(acc) * (2 * z_loss_coeff);
    at::Tensor grad_hs = need_h ? at::empty({n, D}, hs.options()) : at::Tensor();
    at::Tensor grad_w;  // the first chunk's product, then the others added (no zero-filled [V, D] to start from)
    const bf16_matmuls::Operand head(w);  // widened once for all chunks where bf16 matmuls are widened
    for (int64_t s = 0; s < n && (need_h || need_w); s += chunk) {
      const int64_t c = std::min(chunk, n - s);
      const at::Tensor hc = hs.narrow(0, s, c), lc = lse.narrow(0, s, c), tc = ts.narrow(0, s, c);
      // The forward's logits (kept, or again: the same kernel on the same operands), turned in place into their
      // gradient, in the matmul dtype as the unchunked linear's backward has it; products in that dtype.
      at::Tensor dm = kept.defined() ? kept : bf16_matmuls::linear(hc, head);
      kept.reset();  // the one kept chunk is consumed here (the graph is not retained)
      if (!padded && cross_entropy_rows_supported(dm)) {
        cross_entropy_grad_rows_(dm, tc, lc.to(at::kFloat), g_ce.item<float>(), g_z2.item<float>());
      } else {
        const at::Tensor real = padded ? dm.narrow(1, 0, V) : dm;
        at::Tensor d = real.to(acc);  // in place on dm's real columns where mm == acc
        d.sub_(lc.unsqueeze(1)).exp_().mul_((g_ce + g_z2 * lc).unsqueeze(1));
        d.scatter_add_(1, tc.unsqueeze(1), g_ce.neg().expand({c, 1}).contiguous());
        if (padded) {
          if (!d.is_same(real)) real.copy_(d);
          dm.narrow(1, V, Vp - V).zero_();  // the padded ids' logits (0) are no loss's: gradient 0
        } else {
          dm = d.to(mm);
        }
      }
      if (need_h) grad_hs.narrow(0, s, c).copy_(bf16_matmuls::mm(dm, head));
      if (need_w && mm == at::kBFloat16 && acc == at::kFloat && hc.is_cpu() && fp32_output_bf16_gemm_is_fast()) {
        // bf16 x bf16 products summed in fp32 straight into the fp32 gradient, chunk after chunk: no bf16 [V, D]
        // product and no cast pass over it (autocast would round each chunk's product to bf16 first). Only where
        // MKL runs it on AMX: elsewhere oneDNN's bf16 GEMM and the cast below are faster.
        const bool first = !grad_w.defined();
        if (first) grad_w = at::empty({Vp, D}, hc.options().dtype(acc));
        bf16_matmul_into_fp32(grad_w, dm.t(), hc, /*accumulate=*/!first);
      } else if (need_w) {
        if (!grad_w.defined())
          grad_w = bf16_matmuls::mm(dm.t(), hc).to(acc);
        else if (mm == acc)
          grad_w.addmm_(dm.t(), hc);
        else
          grad_w.add_(bf16_matmuls::mm(dm.t(), hc));  // each chunk's product rounded to its dtype once, summed in fp32
      }
    }
    if (need_w && !grad_w.defined()) grad_w = at::zeros({V, D}, w.options().dtype(acc));  // no labelled rows
    if (need_w && padded) grad_w = grad_w.narrow(0, 0, V);  // the first V rows of a row-major [Vp, D]: contiguous
    at::Tensor grad_hidden;
    if (need_h) {
      int64_t N = 1;
      for (int64_t s : shape) N *= s;
      N /= D;
      grad_hidden = n == N
                        ? grad_hs.to(h_dtype)
                        : at::zeros({N, D}, grad_hs.options().dtype(h_dtype)).index_copy_(0, rows, grad_hs.to(h_dtype));
      grad_hidden = grad_hidden.view(shape);
    }
    return {
        grad_hidden, need_w ? grad_w.to(w_dtype) : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
        at::Tensor()};
  }
};

}  // namespace

namespace {

// kHeadPaddingForDevice resolved for the device of `hidden`; anything else below 1 refused, naming `who`.
int64_t head_padding(const char* who, const at::Tensor& hidden, int64_t pad_rows_to) {
  if (pad_rows_to == kHeadPaddingForDevice) return hidden.is_cuda() ? kCudaHeadRowMultiple : 1;
  if (pad_rows_to < 1)
    throw Error(std::string(who) + ": pad_rows_to must be >= 1 or -1, got " + std::to_string(pad_rows_to));
  return pad_rows_to;
}

}  // namespace

LossSums head_loss(const at::Tensor& hidden, const at::Tensor& head_weight, const at::Tensor& labels,
                   double z_loss_coeff, int64_t chunk_tokens, const at::Tensor& head_weight_cast, int64_t pad_rows_to) {
  if (chunk_tokens < 0) throw Error("head_loss: the chunk size must be >= 0, got " + std::to_string(chunk_tokens));
  pad_rows_to = head_padding("head_loss", hidden, pad_rows_to);
  const int64_t D = hidden.size(-1), rows = D > 0 ? hidden.numel() / D : 0;
  if (labels.numel() != rows) {
    throw Error("head_loss: " + std::to_string(labels.numel()) + " labels for " + std::to_string(rows) +
                " rows of hidden states");
  }
  // 0: the unchunked form, the logits through next_token_loss and ATen's autograd (the reference the chunked
  // form is tested against). A micro-batch of at most one chunk keeps that chunk's logits for backward.
  if (chunk_tokens == 0) return next_token_loss(archspace::linear(hidden, head_weight), labels, z_loss_coeff);
  const auto sums = ChunkedHeadLoss::apply(
      hidden, head_weight, head_weight_cast.defined() ? head_weight_cast.detach() : head_weight.detach(), labels,
      z_loss_coeff, chunk_tokens, pad_rows_to);
  return {sums[0], sums[1], (labels != kIgnoreIndex).sum().item<int64_t>()};
}

at::Tensor label_logprobs(const at::Tensor& hidden, const at::Tensor& head_weight, const at::Tensor& labels,
                          int64_t chunk_rows, const LogprobChunkVisitor& visit, int64_t pad_rows_to) {
  if (chunk_rows < 1) throw Error("label_logprobs: the chunk size must be >= 1, got " + std::to_string(chunk_rows));
  pad_rows_to = head_padding("label_logprobs", hidden, pad_rows_to);
  at::NoGradGuard no_grad;
  const at::Tensor h = hidden.reshape({-1, hidden.size(-1)});
  const int64_t N = h.size(0);
  if (labels.numel() != N) {
    throw Error("label_logprobs: " + std::to_string(labels.numel()) + " labels for " + std::to_string(N) +
                " rows of hidden states");
  }
  const at::Tensor target = labels.reshape({-1}).to(h.device(), at::kLong);
  at::Tensor out = at::zeros({N}, h.options().dtype(at::kFloat));
  // The padded rows' logits (0) are computed and never read: the first V columns are the unpadded logits.
  const int64_t V = head_weight.size(0), Vp = padded_head_rows(V, pad_rows_to);
  // (An int8 head, CPU-only, keeps its own layout.)
  const at::Tensor w =
      Vp != V && !is_int8_weight(head_weight) ? at::constant_pad_nd(head_weight, {0, 0, 0, Vp - V}) : head_weight;
  for (int64_t s = 0; s < N; s += chunk_rows) {
    const int64_t c = std::min(chunk_rows, N - s);
    const at::Tensor logits = archspace::linear(h.narrow(0, s, c), w).narrow(1, 0, V);
    const at::Tensor logprobs = at::log_softmax(logits.to(at::kFloat), -1);
    const at::Tensor t = target.narrow(0, s, c);
    out.narrow(0, s, c).copy_(logprobs.gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1).masked_fill_(t < 0, 0));
    if (visit) visit(s, logprobs);
  }
  return out;
}

}  // namespace archspace
