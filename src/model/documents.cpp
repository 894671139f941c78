#include "archspace/model/documents.h"

#include <algorithm>
#include <limits>
#include <string>

#include "archspace/util/error.h"
#include "archspace/util/tensors.h"

namespace archspace {

Documents find_documents(const at::Tensor& input_ids, int64_t eos_token_id) {
  if (input_ids.dim() != 2)
    throw Error("document masking: input_ids must be [batch, time], got " + shape_string(input_ids.sizes().vec()));
  if (eos_token_id < 0)
    throw Error("document masking: needs the EOS token id that ends each document, got " +
                std::to_string(eos_token_id));
  const at::Tensor ids = input_ids.to(at::kCPU, at::kLong).contiguous();
  Documents d;
  d.rows = ids.size(0);
  d.length = ids.size(1);
  const int64_t* p = ids.data_ptr<int64_t>();
  d.cu_seqlens.push_back(0);
  for (int64_t b = 0; b < d.rows; ++b) {
    const int64_t row = b * d.length;
    for (int64_t t = 0; t < d.length; ++t) {
      // An EOS ends its document; the row's last token ends one whatever it is.
      if (p[row + t] == eos_token_id || t + 1 == d.length) d.cu_seqlens.push_back(row + t + 1);
    }
  }
  for (size_t i = 1; i < d.cu_seqlens.size(); ++i)
    d.max_length = std::max(d.max_length, d.cu_seqlens[i] - d.cu_seqlens[i - 1]);
  if (d.cu_seqlens.back() <= std::numeric_limits<int32_t>::max()) {
    std::vector<int32_t> offsets(d.cu_seqlens.begin(), d.cu_seqlens.end());
    d.cu_seqlens_int32 = at::tensor(offsets, at::kInt).to(input_ids.device());
  }
  return d;
}

std::vector<std::pair<int64_t, int64_t>> Documents::row_spans(int64_t row) const {
  const int64_t first = row * length, last = first + length;
  auto begin = std::lower_bound(cu_seqlens.begin(), cu_seqlens.end(), first);
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (auto it = begin; it + 1 != cu_seqlens.end() && *it < last; ++it) spans.emplace_back(*it - first, it[1] - first);
  return spans;
}

at::Tensor Documents::cu_seqlens_tensor(at::Device device) const {
  if (!cu_seqlens_int32.defined())
    throw Error("document masking: " + std::to_string(cu_seqlens.back()) +
                " tokens in one micro-batch, more than the flash kernel's int32 offsets hold");
  return cu_seqlens_int32.device() == device ? cu_seqlens_int32 : cu_seqlens_int32.to(device);
}

at::Tensor Documents::document_ids(at::Device device) const {
  at::Tensor ids = at::empty({rows * length}, at::kLong);
  int64_t* p = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i + 1 < static_cast<int64_t>(cu_seqlens.size()); ++i)
    std::fill(p + cu_seqlens[i], p + cu_seqlens[i + 1], i);
  return ids.view({rows, length}).to(device);
}

}  // namespace archspace
