// Intra-document masking (train.document_masking): the documents of packed training instances, so that
// attention stays inside each one. Documents are found from their EOS tokens as OLMo-core finds them
// (olmo_core.data.utils.get_document_lengths): a document ends with its EOS token, the token after an EOS
// starts the next document, and the end of an instance ends its last one. A document never spans two rows.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace archspace {

struct Documents {
  int64_t rows = 0, length = 0;  // the [B, T] batch they were found in
  // Boundaries over the batch's B * T tokens read row after row: 0 = cu_seqlens[0] < ... < cu_seqlens[n] = B * T,
  // document i being tokens [cu_seqlens[i], cu_seqlens[i + 1]); every row starts a document. This is what
  // flash attention's variable-length form takes as cum_seq_q and cum_seq_k.
  std::vector<int64_t> cu_seqlens;
  int64_t max_length = 0;  // the longest document (the variable-length kernel's max_q and max_k)
  // cu_seqlens as int32 on the batch's device, made once per batch so that every layer's kernel call keeps the
  // same tensor; undefined when B * T does not fit in int32 (cu_seqlens_tensor then throws).
  at::Tensor cu_seqlens_int32;

  int64_t count() const { return static_cast<int64_t>(cu_seqlens.size()) - 1; }
  // Each row is one document: masking changes nothing.
  bool whole_rows() const { return count() == rows; }
  // The documents of row `row`, as [start, end) positions within the row.
  std::vector<std::pair<int64_t, int64_t>> row_spans(int64_t row) const;
  // cu_seqlens as an int32 tensor on `device` (the kernel's type; throws if B * T does not fit): the one
  // made with the batch when it is on that device.
  at::Tensor cu_seqlens_tensor(at::Device device) const;
  // Each token's document index, [B, T] int64 on `device` (the reference path's mask: attention where equal).
  at::Tensor document_ids(at::Device device) const;
};

// The documents of input_ids [B, T] (an integer tensor on any device; read on the CPU), each ending with
// `eos_token_id` or with its row. Throws archspace::Error for a negative id or a batch that is not [B, T].
Documents find_documents(const at::Tensor& input_ids, int64_t eos_token_id);

}  // namespace archspace
