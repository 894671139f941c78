#include "archspace/data/megatron_samples.h"

#include <string>

#include "archspace/data/numpy_random.h"
#include "archspace/util/error.h"

namespace archspace {

namespace {

// _build_document_index without a separate final epoch: numpy.mgrid[0:epochs, 0:n][1] flattened (each epoch's
// documents in order), as int32, shuffled.
std::vector<int32_t> shuffled_documents(size_t documents, int32_t epochs, NumpyRandomState& rng) {
  std::vector<int32_t> index;
  index.reserve(documents * static_cast<size_t>(epochs));
  for (int32_t e = 0; e < epochs; ++e)
    for (size_t d = 0; d < documents; ++d) index.push_back(static_cast<int32_t>(d));
  rng.shuffle(index);
  return index;
}

// _build_shuffle_index: [0, first) shuffled, then [first, total) shuffled on its own.
std::vector<uint64_t> shuffled_samples(uint64_t first, uint64_t total, NumpyRandomState& rng) {
  std::vector<uint64_t> head(first);
  for (uint64_t i = 0; i < first; ++i) head[i] = i;
  rng.shuffle(head);
  if (first == total) return head;
  std::vector<uint64_t> tail(total - first);
  for (uint64_t i = first; i < total; ++i) tail[i - first] = i;
  rng.shuffle(tail);
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

}  // namespace

MegatronSampleIndex build_megatron_sample_index(const std::vector<int32_t>& lengths, int32_t sequence_length,
                                                uint64_t num_samples, uint64_t seed, bool add_extra_token) {
  const int64_t extra = add_extra_token ? 1 : 0, S = sequence_length;
  if (S <= 1) throw Error("megatron sample index: sequence length " + std::to_string(S) + " must be above 1");
  int64_t tokens_per_epoch = 0;
  for (int32_t n : lengths) {
    if (n < 0) throw Error("megatron sample index: a negative document length");
    tokens_per_epoch += n;
  }
  if (tokens_per_epoch <= 1)
    throw Error("megatron sample index: the documents hold " + std::to_string(tokens_per_epoch) +
                " tokens; Megatron needs more than one");

  MegatronSampleIndex out;
  // _get_num_epochs
  out.epochs = 1;
  const int64_t requested = static_cast<int64_t>(num_samples) * S + extra;
  for (int64_t tokens = tokens_per_epoch; tokens < requested; tokens += tokens_per_epoch) ++out.epochs;

  int64_t samples_before_final = 0;
  if (out.epochs > 1) {
    samples_before_final = ((out.epochs - 1) * tokens_per_epoch - extra) / S;
    const int64_t from_final = static_cast<int64_t>(num_samples) - samples_before_final;
    const int64_t per_epoch = (tokens_per_epoch - extra) / S;
    // int(0.80 * per_epoch) in Python: the double product, truncated.
    out.separate_final_epoch = from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }

  NumpyRandomState rng(seed);
  if (!out.separate_final_epoch) {
    out.document_index = shuffled_documents(lengths.size(), out.epochs, rng);
  } else {
    out.document_index = shuffled_documents(lengths.size(), out.epochs - 1, rng);
    const std::vector<int32_t> last = shuffled_documents(lengths.size(), 1, rng);
    out.document_index.insert(out.document_index.end(), last.begin(), last.end());
  }

  // build_sample_idx with drop_last_partial_sequence (training): each sample takes S + extra tokens from the
  // documents in document_index order, the next one starting `extra` tokens before this one ended.
  const int64_t samples = (out.epochs * tokens_per_epoch - extra) / S;
  out.sample_document.reserve(samples + 1);
  out.sample_offset.reserve(samples + 1);
  int64_t position = 0, offset = 0;
  out.sample_document.push_back(position);
  out.sample_offset.push_back(offset);
  const int64_t last_position = static_cast<int64_t>(out.document_index.size()) - 1;
  for (int64_t i = 1; i <= samples; ++i) {
    int64_t remaining = S + extra;
    while (remaining != 0) {
      const int64_t document_length = lengths[out.document_index[position]] - offset;
      remaining -= document_length;
      if (remaining <= 0) {
        offset += remaining + document_length - extra;
        remaining = 0;
      } else {
        if (position == last_position) {  // the end of the documents: the last sample ends there
          offset = lengths[out.document_index[position]] - extra;
          break;
        }
        ++position;
        offset = 0;
      }
    }
    out.sample_document.push_back(position);
    out.sample_offset.push_back(offset);
  }

  out.shuffle_index = shuffled_samples(
      out.separate_final_epoch ? static_cast<uint64_t>(samples_before_final) : static_cast<uint64_t>(samples),
      static_cast<uint64_t>(samples), rng);
  return out;
}

}  // namespace archspace
