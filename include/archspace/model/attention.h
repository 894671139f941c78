// Causal (sliding-window or full) attention with GQA (SPEC.md section 1), and the rule that picks its kernel
// from what a call looks like: flash (CUDA), SDPA in its causal, unmasked, blocked, masked and per-document
// forms, or the explicit reference the tests compare against.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "archspace/model/documents.h"

namespace archspace {

enum class AttentionImpl {
  kSdpa,       // LibTorch's fused scaled_dot_product_attention (flash/efficient kernels where available)
  kReference,  // explicit fp32 scores, mask and softmax: slow, obviously right, what tests compare against
};

// Which keys query i may see: keys j with i - window < j <= i (window > 0), or all j <= i (window == 0).
// Queries sit at absolute positions q_offset .. q_offset + Tq - 1 and keys at 0 .. Tk - 1.
// Returns a bool mask [Tq, Tk], true where attention is allowed.
at::Tensor causal_mask(int64_t tq, int64_t tk, int64_t window, int64_t q_offset, const at::Device& device);

// The kernel causal_attention runs, chosen from what the call looks like (a pure rule, so that tests on
// a CPU can ask what a CUDA call would do).
enum class AttentionPath {
  kReference,    // AttentionImpl::kReference
  kFlash,        // CUDA, bf16/fp16, whole causal sequence: at::_flash_attention_forward with the window
  kSdpaCausal,   // SDPA with is_causal (no mask read)
  kSdpaNoMask,   // one decoding query that sees every cached key
  kSdpaBlocked,  // sliding window over T > 2 window: query blocks, each with its keys and a small mask
  kSdpaMasked,   // SDPA with an explicit [Tq, Tk] mask (padding, chunks, T <= 2 window)
  // Document masking (model/documents.h): attention within each document of each row.
  kFlashVarlen,    // CUDA, bf16/fp16: one variable-length flash call over every document (cu_seqlens)
  kSdpaDocuments,  // elsewhere: each document alone through the paths above (no [T, T] mask across documents)
};
// `documents`: the call masks documents (whole training sequences only: q_offset 0, Tq == Tk, no padding).
AttentionPath attention_path(AttentionImpl impl, at::Device device, at::ScalarType dtype, int64_t tq, int64_t tk,
                             int64_t head_dim, int64_t window, int64_t q_offset, bool padded, bool documents = false);

// SDPA on CUDA is kept off cuDNN's attention: cuDNN builds an execution graph for every new shape, and decoding
// (and chunked prefill) changes the key length every call. On an H200 (2026-12-04, 1B bf16, batch 1) those builds
// took 60% of generate's op time, ~5 ms per layer per token: 9-21 decoded tokens/s. Flash and memory-efficient
// attention take any length without a plan. Process-wide and idempotent; causal_attention calls it for CUDA
// tensors, before their first SDPA call.
void avoid_cudnn_attention();

// What a flash-attention call is given for a causal attention of T queries over the same T keys with
// `window` (0: full): the kernel lets query i see keys i - window_left .. i + window_right (-1: no bound
// on that side), is_causal masks keys after the query.
struct FlashArguments {
  bool is_causal;
  int64_t window_left, window_right;
  double scale;
};
FlashArguments flash_arguments(int64_t window, int64_t head_dim);

// The variable-length form of the flash kernel: the tokens of several sequences one after another, sequence
// i being tokens [cu_seqlens[i], cu_seqlens[i + 1]) (int32, on the tensors' device; 0 first, the token count
// last), none longer than max_seqlen. Each attends only within itself, positions counted from its start.
struct FlashSequences {
  at::Tensor cu_seqlens;
  int64_t max_seqlen = 0;
};

// The flash kernel: q [B, T, H, h], k, v [B, T, G, h] (its layout) -> [B, T, H, h]; with `sequences`, q
// [N, H, h], k, v [N, G, h] (the N tokens of all sequences) -> [N, H, h]. On CUDA
// at::_flash_attention_forward (autograd passes the window and the offsets to its backward); `cpu_stand_in`
// instead checks the arguments as the kernel requires them and computes what the kernel is documented to
// compute from them, in fp32 on any device, so that the CPU tests check the arguments and layouts this
// engine passes.
at::Tensor flash_kernel(const at::Tensor& q_BTHD, const at::Tensor& k_BTGD, const at::Tensor& v_BTGD,
                        const FlashArguments& args, bool cpu_stand_in = false,
                        const FlashSequences* sequences = nullptr);

// Causal attention through the flash kernel: q [B, H, T, h], k, v [B, G, T, h] -> [B, H, T, h] (a view
// of the kernel's [B, T, H, h] output). k and v are cast to q's dtype (Depth-Attention's mix may be fp32
// under autocast). With `documents` (found in this [B, T] batch) one variable-length call attends within
// each document: the B * T tokens as one [N, H, h] batch, the documents' boundaries as cu_seqlens.
at::Tensor flash_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                                  bool cpu_stand_in = false, const Documents* documents = nullptr);

// q [B, H, Tq, h]; k, v [B, G, Tk, h] with H a multiple of G (query head j reads kv head j / (H/G)).
// Scale 1/sqrt(h). `padding_mask` ([B, 1, Tq, Tk] bool, optional) further restricts the causal mask
// (left-padded batches, see KVCache). `documents` (optional; found in this [B, T] batch) restricts it to
// each document: query i sees key j only within i's document (and its window there), as if each document
// ran alone; not with a padding mask or queries offset into a cache. Returns [B, H, Tq, h] in q's dtype.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                            int64_t q_offset, AttentionImpl impl, const at::Tensor& padding_mask = {},
                            const Documents* documents = nullptr);

}  // namespace archspace
