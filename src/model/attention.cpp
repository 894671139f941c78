#include "archspace/model/attention.h"

#include <cmath>
#include <mutex>

#include "archspace/kernels/bf16_matmuls.h"
#include "archspace/kernels/decode_attention.h"
#include "archspace/kernels/dispatch.h"
#include "archspace/model/rms_norm.h"
#include "archspace/util/error.h"

namespace archspace {

at::Tensor causal_mask(int64_t tq, int64_t tk, int64_t window, int64_t q_offset, const at::Device& device) {
  auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor i = (at::arange(tq, opts) + q_offset).unsqueeze(1);  // query positions [Tq, 1]
  at::Tensor j = at::arange(tk, opts).unsqueeze(0);               // key positions [1, Tk]
  at::Tensor allowed = j <= i;
  if (window > 0) allowed = allowed & (j > i - window);
  return allowed;
}

namespace {

// The causal (and window) mask, narrowed by the padding mask when there is one.
at::Tensor full_mask(int64_t tq, int64_t tk, int64_t window, int64_t q_offset, const at::Tensor& padding_mask,
                     const at::Device& device) {
  at::Tensor allowed = causal_mask(tq, tk, window, q_offset, device);
  return padding_mask.defined() ? allowed & padding_mask : allowed;
}

at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                               int64_t q_offset, const at::Tensor& padding_mask, const Documents* documents) {
  const int64_t groups = q.size(1) / k.size(1);
  const at::ScalarType dtype = compute_dtype(q);
  at::Tensor kf = k.to(dtype).repeat_interleave(groups, 1);
  at::Tensor vf = v.to(dtype).repeat_interleave(groups, 1);
  at::Tensor scores = at::matmul(q.to(dtype), kf.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor allowed = full_mask(q.size(2), k.size(2), window, q_offset, padding_mask, q.device());
  if (documents) {  // the block-diagonal mask [B, 1, T, T]: query and key in the same document
    const at::Tensor doc = documents->document_ids(q.device());
    allowed = allowed & (doc.unsqueeze(1).unsqueeze(3) == doc.unsqueeze(1).unsqueeze(2));
  }
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  at::Tensor probs = at::softmax(scores, -1);
  return at::matmul(probs, vf).to(q.scalar_type());
}

}  // namespace

AttentionPath attention_path(AttentionImpl impl, at::Device device, at::ScalarType dtype, int64_t tq, int64_t tk,
                             int64_t head_dim, int64_t window, int64_t q_offset, bool padded, bool documents) {
  if (impl == AttentionImpl::kReference) return AttentionPath::kReference;
  const bool whole_sequence = !padded && q_offset == 0 && tq == tk;
  // The flash kernel: CUDA, half precision, head sizes it was built for. It takes the window itself, so
  // sliding layers need no mask at any length (the path below this one builds masks block by block).
  const bool half = dtype == at::kBFloat16 || dtype == at::kHalf;
  const bool flash = device.is_cuda() && half && head_dim % 8 == 0 && head_dim <= 256;
  if (documents && whole_sequence) return flash ? AttentionPath::kFlashVarlen : AttentionPath::kSdpaDocuments;
  if (whole_sequence && flash) return AttentionPath::kFlash;
  if (whole_sequence && (window == 0 || window >= tk)) return AttentionPath::kSdpaCausal;
  if (!padded && tq == 1 && q_offset == tk - 1 && (window == 0 || window >= tk)) return AttentionPath::kSdpaNoMask;
  if (window > 0 && tq > 2 * window) return AttentionPath::kSdpaBlocked;
  return AttentionPath::kSdpaMasked;
}

void avoid_cudnn_attention() {
  static std::once_flag once;
  std::call_once(once, [] { at::globalContext().setSDPUseCuDNN(false); });
}

FlashArguments flash_arguments(int64_t window, int64_t head_dim) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  // Sliding: query i sees keys i - (window - 1) .. i, the window counting the query itself. Full: causal.
  if (window > 0) return {/*is_causal=*/false, window - 1, 0, scale};
  return {/*is_causal=*/true, -1, -1, scale};
}

namespace {

// The variable-length kernel's preconditions (flash attention's mha_varlen_fwd checks the same): tokens as
// [N, heads, h] with contiguous rows, int32 offsets on the tensors' device from 0 to N, none decreasing, no
// sequence longer than max_seqlen.
void check_sequences(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashSequences& s) {
  auto fail = [](const std::string& what) { throw Error("flash attention (variable length): " + what); };
  if (q.dim() != 3 || k.dim() != 3 || v.dim() != 3) fail("q, k and v must be [tokens, heads, head_dim]");
  if (k.size(0) != q.size(0) || v.size(0) != q.size(0)) fail("q, k and v must hold the same tokens");
  if (q.stride(-1) != 1 || k.stride(-1) != 1 || v.stride(-1) != 1) fail("the last dimension must be contiguous");
  const at::Tensor& cu = s.cu_seqlens;
  if (cu.scalar_type() != at::kInt || cu.dim() != 1 || cu.size(0) < 2) fail("cu_seqlens must be int32 [sequences + 1]");
  if (cu.device() != q.device()) fail("cu_seqlens must be on the tensors' device");
  const at::Tensor c = cu.to(at::kCPU, at::kLong);
  const at::Tensor lengths = c.narrow(0, 1, c.size(0) - 1) - c.narrow(0, 0, c.size(0) - 1);
  if (c[0].item<int64_t>() != 0 || c[-1].item<int64_t>() != q.size(0))
    fail("cu_seqlens must run from 0 to the token count " + std::to_string(q.size(0)));
  if ((lengths < 0).any().item<bool>()) fail("cu_seqlens must not decrease");
  if (lengths.max().item<int64_t>() > s.max_seqlen)
    fail("a sequence of " + std::to_string(lengths.max().item<int64_t>()) + " tokens exceeds max_seqlen " +
         std::to_string(s.max_seqlen));
}

// What the kernel computes for one sequence [B, T, H, h] from its arguments alone (not from causal_mask):
// query i sees key j when i - left <= j <= i + right (a negative bound is none), and j <= i when
// is_causal; query head h reads kv head h / (H / G).
at::Tensor flash_stand_in(const at::Tensor& q_BTHD, const at::Tensor& k_BTGD, const at::Tensor& v_BTGD,
                          const FlashArguments& args) {
  const int64_t T = q_BTHD.size(1), Tk = k_BTGD.size(1);
  auto opts = at::TensorOptions().dtype(at::kLong).device(q_BTHD.device());
  at::Tensor i = at::arange(T, opts).unsqueeze(1), j = at::arange(Tk, opts).unsqueeze(0);
  at::Tensor allowed = at::ones({T, Tk}, opts.dtype(at::kBool));
  if (args.window_left >= 0) allowed = allowed & (j >= i - args.window_left);
  if (args.window_right >= 0) allowed = allowed & (j <= i + args.window_right);
  if (args.is_causal) allowed = allowed & (j <= i);
  const int64_t groups = q_BTHD.size(2) / k_BTGD.size(2);
  at::Tensor q = q_BTHD.to(at::kFloat).transpose(1, 2);
  at::Tensor k = k_BTGD.to(at::kFloat).transpose(1, 2).repeat_interleave(groups, 1);
  at::Tensor v = v_BTGD.to(at::kFloat).transpose(1, 2).repeat_interleave(groups, 1);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * args.scale;
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), v).transpose(1, 2).to(q_BTHD.scalar_type());
}

}  // namespace

at::Tensor flash_kernel(const at::Tensor& q_BTHD, const at::Tensor& k_BTGD, const at::Tensor& v_BTGD,
                        const FlashArguments& args, bool cpu_stand_in, const FlashSequences* sequences) {
  auto opt = [](int64_t w) { return w < 0 ? std::nullopt : std::optional<int64_t>(w); };
  if (sequences) {
    const at::Tensor &q = q_BTHD, &k = k_BTGD, &v = v_BTGD;  // [N, heads, h]
    if (!cpu_stand_in) {
      return std::get<0>(at::_flash_attention_forward(
          q, k, v, sequences->cu_seqlens, sequences->cu_seqlens, sequences->max_seqlen, sequences->max_seqlen, 0.0,
          args.is_causal, false, args.scale, opt(args.window_left), opt(args.window_right)));
    }
    check_sequences(q, k, v, *sequences);
    // Each sequence on its own, positions from its start: the kernel's definition of the variable-length form.
    const at::Tensor cu = sequences->cu_seqlens.to(at::kCPU, at::kLong);
    std::vector<at::Tensor> outs;
    for (int64_t i = 0; i + 1 < cu.size(0); ++i) {
      const int64_t s = cu[i].item<int64_t>(), len = cu[i + 1].item<int64_t>() - s;
      if (len == 0) continue;
      outs.push_back(flash_stand_in(q.narrow(0, s, len).unsqueeze(0), k.narrow(0, s, len).unsqueeze(0),
                                    v.narrow(0, s, len).unsqueeze(0), args)[0]);
    }
    return at::cat(outs, 0);
  }
  const int64_t T = q_BTHD.size(1), Tk = k_BTGD.size(1);
  if (!cpu_stand_in) {
    auto opt = [](int64_t w) { return w < 0 ? std::nullopt : std::optional<int64_t>(w); };
    return std::get<0>(at::_flash_attention_forward(q_BTHD, k_BTGD, v_BTGD, std::nullopt, std::nullopt, T, Tk, 0.0,
                                                    args.is_causal, false, args.scale, opt(args.window_left),
                                                    opt(args.window_right)));
  }
  return flash_stand_in(q_BTHD, k_BTGD, v_BTGD, args);
}

at::Tensor flash_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                                  bool cpu_stand_in, const Documents* documents) {
  // [B, H, T, h] -> the kernel's [B, T, H, h]: views whose last dimension stays contiguous, as it needs.
  const at::ScalarType dtype = q.scalar_type();
  const FlashArguments args = flash_arguments(window, q.size(-1));
  at::Tensor q_BTHD = q.transpose(1, 2), k_BTGD = k.to(dtype).transpose(1, 2), v_BTGD = v.to(dtype).transpose(1, 2);
  if (!documents) return flash_kernel(q_BTHD, k_BTGD, v_BTGD, args, cpu_stand_in).transpose(1, 2);
  // Documents: the batch's B * T tokens as one run of sequences [N, heads, h] (a view where the layout
  // allows; RoPE's output already is [B, T, H, h] in memory), the documents' boundaries as the offsets.
  const int64_t B = q.size(0), T = q.size(2), N = B * T;
  if (documents->rows != B || documents->length != T)
    throw Error("flash attention: documents of a [" + std::to_string(documents->rows) + ", " +
                std::to_string(documents->length) + "] batch for a [" + std::to_string(B) + ", " + std::to_string(T) +
                "] attention");
  const FlashSequences sequences{documents->cu_seqlens_tensor(q.device()), documents->max_length};
  at::Tensor out = flash_kernel(q_BTHD.reshape({N, q.size(1), q.size(3)}), k_BTGD.reshape({N, k.size(1), k.size(3)}),
                                v_BTGD.reshape({N, v.size(1), v.size(3)}), args, cpu_stand_in, &sequences);
  return out.view({B, T, q.size(1), q.size(3)}).transpose(1, 2);
}

namespace {

// Document masking off the flash kernel: each document alone, through the path its own length takes
// (plain causal within the window, one mask up to two windows, masks per query block beyond), then the
// pieces in the [B, T, H, h] order o_proj reads.
at::Tensor attention_by_document(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                                 const Documents& documents) {
  std::vector<at::Tensor> pieces;
  for (int64_t b = 0; b < q.size(0); ++b) {
    for (auto [s, e] : documents.row_spans(b)) {
      auto doc = [&](const at::Tensor& t) { return t.narrow(0, b, 1).narrow(2, s, e - s); };
      pieces.push_back(causal_attention(doc(q), doc(k), doc(v), window, 0, AttentionImpl::kSdpa).transpose(1, 2));
    }
  }
  return at::cat(pieces, 1).view({q.size(0), q.size(2), q.size(1), q.size(3)}).transpose(1, 2);
}

}  // namespace

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                            int64_t q_offset, AttentionImpl impl, const at::Tensor& padding_mask,
                            const Documents* documents) {
  const int64_t tq = q.size(2), tk = k.size(2);
  if (documents) {
    if (padding_mask.defined() || q_offset != 0 || tq != tk)
      throw Error("attention: document masking is for whole training sequences (no KV cache, no padding)");
    if (documents->rows != q.size(0) || documents->length != tq)
      throw Error("attention: documents of a [" + std::to_string(documents->rows) + ", " +
                  std::to_string(documents->length) + "] batch for queries [" + std::to_string(q.size(0)) + ", " +
                  std::to_string(tq) + "]");
  }
  const AttentionPath path = attention_path(impl, q.device(), q.scalar_type(), tq, tk, q.size(-1), window, q_offset,
                                            padding_mask.defined(), documents != nullptr);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const bool gqa = q.size(1) != k.size(1);
  if (q.is_cuda()) avoid_cudnn_attention();
  switch (path) {
    case AttentionPath::kReference:
      return reference_attention(q, k, v, window, q_offset, padding_mask, documents);
    case AttentionPath::kFlash:
      return flash_causal_attention(q, k, v, window);
    case AttentionPath::kFlashVarlen:
      return flash_causal_attention(q, k, v, window, /*cpu_stand_in=*/false, documents);
    case AttentionPath::kSdpaDocuments:
      return attention_by_document(q, k, v, window, *documents);
    case AttentionPath::kSdpaCausal:
      // is_causal lets the kernels skip masked blocks instead of reading a mask.
      return bf16_matmuls::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, 0.0, /*is_causal=*/true, scale, gqa);
    case AttentionPath::kSdpaNoMask:                                     // decoding: no mask to build or read
      if (decode_attention_kernel(q, k, v) == Kernel::kDecodeAttention)  // inference on the CPU
        return decode_attention(q, k, v, scale);
      return bf16_matmuls::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, 0.0, /*is_causal=*/false, scale,
                                                        gqa);
    case AttentionPath::kSdpaBlocked:
    case AttentionPath::kSdpaMasked:
      break;
  }
  if (path == AttentionPath::kSdpaBlocked) {
    // Long sequences under a sliding window: attend block by block, each query block reading only the
    // keys its window reaches, so memory grows with T * window instead of T^2 (65,536-token contexts).
    std::vector<at::Tensor> blocks;
    for (int64_t s = 0; s < tq; s += window) {
      const int64_t e = std::min(tq, s + window);
      const int64_t k0 = std::max<int64_t>(0, s + q_offset - (window - 1)), k1 = std::min(tk, e + q_offset);
      at::Tensor block_padding =
          padding_mask.defined() ? padding_mask.narrow(2, s, e - s).narrow(3, k0, k1 - k0) : at::Tensor();
      at::Tensor mask = full_mask(e - s, k1 - k0, window, s + q_offset - k0, block_padding, q.device());
      blocks.push_back(bf16_matmuls::scaled_dot_product_attention(
          q.narrow(2, s, e - s), k.narrow(2, k0, k1 - k0), v.narrow(2, k0, k1 - k0), mask, 0.0, false, scale, gqa));
    }
    return at::cat(blocks, 2);
  }
  // Decoding a padded batch (one query at the last slot, every key within its window): the causal mask is all
  // true, so the padding mask is the whole mask.
  const bool decoding = tq == 1 && q_offset == tk - 1 && (window == 0 || window >= tk);
  if (decoding && padding_mask.defined() && decode_attention_kernel(q, k, v, padding_mask) == Kernel::kDecodeAttention)
    return decode_attention(q, k, v, scale, padding_mask);
  at::Tensor mask =
      decoding && padding_mask.defined() ? padding_mask : full_mask(tq, tk, window, q_offset, padding_mask, q.device());
  return bf16_matmuls::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false, scale, gqa);
}

}  // namespace archspace
