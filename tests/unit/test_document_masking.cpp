// Intra-document masking (train.document_masking; model/documents.h): documents found as OLMo-core finds
// them, attention within each document on every path (SDPA per document, the reference's block-diagonal
// mask, the flash kernel's variable-length form through its CPU stand-in), and a packed instance of three
// documents equal to each document run alone, logits and gradients, for both variants.
#include <gtest/gtest.h>

#include <cstdio>

#include "archspace/model/attention.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/documents.h"
#include "archspace/model/loss.h"
#include "forward_option_fields.h"
#include "test_support.h"
#include "tolerance.h"

namespace archspace {
namespace {

constexpr int64_t kEos = 0;  // the tiny preset's eos_token_id

at::Tensor ids(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), -1});
}

// Rows of random non-EOS tokens with an EOS ending each document of `lengths` (the last document of a row
// runs to the row's end and ends with EOS only if its length says so: here it never does).
at::Tensor packed_row(const std::vector<int64_t>& lengths, int64_t vocab, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  int64_t T = 0;
  for (int64_t n : lengths) T += n;
  at::Tensor row = at::randint(2, vocab, {T}, gen, at::kLong);  // ids 0 (EOS) and 1 (pad) do not occur
  int64_t end = 0;
  for (size_t i = 0; i + 1 < lengths.size(); ++i) {
    end += lengths[i];
    row[end - 1] = kEos;
  }
  return row;
}

}  // namespace

// OLMo-core's get_document_lengths on each row: boundaries after every EOS and at the row's end (never an
// empty document after a final EOS). Row [5 0 3 4 0 7]: documents [5 0] [3 4 0] [7]; row [0 1 2 3 4 5]:
// [0] [1 2 3 4 5], which begin at flat offset 6.
TEST(Documents, FoundAsOlmoCoreFindsThem) {
  const Documents d = find_documents(ids({{5, 0, 3, 4, 0, 7}, {0, 1, 2, 3, 4, 5}}), kEos);
  EXPECT_EQ(d.rows, 2);
  EXPECT_EQ(d.length, 6);
  EXPECT_EQ(d.cu_seqlens, (std::vector<int64_t>{0, 2, 5, 6, 7, 12}));
  EXPECT_EQ(d.max_length, 5);
  EXPECT_EQ(d.count(), 5);
  EXPECT_FALSE(d.whole_rows());
  using Spans = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(d.row_spans(0), (Spans{{0, 2}, {2, 5}, {5, 6}}));
  EXPECT_EQ(d.row_spans(1), (Spans{{0, 1}, {1, 6}}));
  EXPECT_TRUE(at::equal(d.document_ids(at::kCPU), ids({{0, 0, 1, 1, 1, 2}, {3, 4, 4, 4, 4, 4}})));
  const at::Tensor cu = d.cu_seqlens_tensor(at::kCPU);
  EXPECT_EQ(cu.scalar_type(), at::kInt);
  EXPECT_TRUE(at::equal(cu, at::tensor(std::vector<int32_t>{0, 2, 5, 6, 7, 12}, at::kInt)));

  // A row ending with EOS; EOS after EOS (a one-token document); rows without EOS (nothing to mask).
  EXPECT_EQ(find_documents(ids({{1, 2, 0}}), kEos).cu_seqlens, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(find_documents(ids({{0, 0, 1}}), kEos).cu_seqlens, (std::vector<int64_t>{0, 1, 2, 3}));
  const Documents none = find_documents(ids({{1, 2, 3}, {4, 5, 6}}), kEos);
  EXPECT_EQ(none.cu_seqlens, (std::vector<int64_t>{0, 3, 6}));
  EXPECT_TRUE(none.whole_rows());
  EXPECT_EQ(none.max_length, 3);
}

TEST(Documents, BadInputNamesTheProblem) {
  using testing::expect_error;
  expect_error([] { find_documents(ids({{1, 0, 2}}), -1); }, {"EOS token id", "-1"});
  expect_error([] { find_documents(at::zeros({4}, at::kLong), 0); }, {"[batch, time]", "[4]"});
}

// The dispatch rule: documents go to the variable-length flash kernel where the dense one would run (CUDA,
// half precision), elsewhere to SDPA one document at a time; the reference stays the reference.
TEST(Documents, AttentionPath) {
  const at::Device cuda(at::kCUDA, 0), cpu(at::kCPU);
  auto path = [](at::Device dev, at::ScalarType dtype, int64_t window, int64_t head_dim = 128,
                 AttentionImpl impl = AttentionImpl::kSdpa) {
    return attention_path(impl, dev, dtype, 8192, 8192, head_dim, window, 0, false, /*documents=*/true);
  };
  for (int64_t window : {0, 4096}) {
    EXPECT_EQ(path(cuda, at::kBFloat16, window), AttentionPath::kFlashVarlen);
    EXPECT_EQ(path(cuda, at::kHalf, window), AttentionPath::kFlashVarlen);
    EXPECT_EQ(path(cuda, at::kFloat, window), AttentionPath::kSdpaDocuments);
    EXPECT_EQ(path(cpu, at::kBFloat16, window), AttentionPath::kSdpaDocuments);
    EXPECT_EQ(path(cuda, at::kBFloat16, window, /*head_dim=*/12), AttentionPath::kSdpaDocuments);
    EXPECT_EQ(path(cuda, at::kBFloat16, window, 128, AttentionImpl::kReference), AttentionPath::kReference);
  }
}

namespace {

// q, k, v of one [B, T] batch and its documents; the reference is each document's own attention, run
// alone (the reference path without documents on that document's slice).
struct Case {
  at::Tensor q, k, v;
  Documents documents;
};

Case attention_case(at::ScalarType dtype, uint64_t seed) {
  // Row 0: documents of 3, 20 and 7 tokens; row 1: 1, 1, 28 (one-token documents, a long last one).
  const at::Tensor batch = at::stack({packed_row({3, 20, 7}, 50, seed), packed_row({1, 1, 28}, 50, seed + 1)});
  at::manual_seed(seed);
  const int64_t B = 2, H = 4, G = 2, T = 30, h = 16;
  auto opts = at::TensorOptions().dtype(dtype);
  return {at::randn({B, H, T, h}, opts), at::randn({B, G, T, h}, opts), at::randn({B, G, T, h}, opts),
          find_documents(batch, kEos)};
}

at::Tensor each_document_alone(const Case& c, int64_t window) {
  at::Tensor out = at::empty_like(c.q);
  for (int64_t b = 0; b < c.q.size(0); ++b) {
    for (auto [s, e] : c.documents.row_spans(b)) {
      auto doc = [&](const at::Tensor& t) { return t.narrow(0, b, 1).narrow(2, s, e - s); };
      doc(out).copy_(causal_attention(doc(c.q), doc(c.k), doc(c.v), window, 0, AttentionImpl::kReference));
    }
  }
  return out;
}

// Windows 0 (full), 3 and 8 (shorter than the long documents: the 20- and 28-token ones take the blocked
// path, T > 2 window, and the 7-token one a single mask with window 3) and 50 (longer than every document).
const std::vector<int64_t> kWindows = {0, 3, 8, 50};

}  // namespace

// Every path with documents equals each document alone: two fp32 computations of the same attention with
// at most `keys` keys a query, within attention_bound (tolerance.h); the reference's block-diagonal mask is
// built from the document indices, independently of the per-document loop.
TEST(DocumentAttention, EveryPathEqualsEachDocumentAlone) {
  const Case c = attention_case(at::kFloat, 7);
  for (int64_t window : kWindows) {
    const at::Tensor alone = each_document_alone(c, window);
    const int64_t keys = window > 0 ? std::min<int64_t>(window, c.documents.max_length) : c.documents.max_length;
    const double bound = tolerance::attention_bound(c.q, c.k, c.v, keys);
    const at::Tensor sdpa = causal_attention(c.q, c.k, c.v, window, 0, AttentionImpl::kSdpa, {}, &c.documents);
    const at::Tensor reference =
        causal_attention(c.q, c.k, c.v, window, 0, AttentionImpl::kReference, {}, &c.documents);
    const at::Tensor flash = flash_causal_attention(c.q, c.k, c.v, window, /*cpu_stand_in=*/true, &c.documents);
    EXPECT_TRUE(tolerance::within(sdpa, alone, bound)) << "sdpa, window " << window;
    EXPECT_TRUE(tolerance::within(reference, alone, bound)) << "reference, window " << window;
    EXPECT_TRUE(tolerance::within(flash, alone, bound)) << "flash stand-in, window " << window;
    // And masking changes the result: the row's later documents no longer see the earlier ones.
    const at::Tensor across = causal_attention(c.q, c.k, c.v, window, 0, AttentionImpl::kReference);
    EXPECT_GT((across - alone).abs().max().item<double>(), 1e-2) << window;
  }
}

// Gradients in fp64 (SDPA's CPU math kernel and the reference both run in fp64): the per-document path's
// views, concatenation and blocked pieces route each gradient to its document. fp64 rounding of values of
// order 1 over at most 30 terms: 1e-12 is far above it and far below any misrouted gradient.
TEST(DocumentAttention, GradientsEqualTheReference) {
  const Case c = attention_case(at::kDouble, 11);
  const at::Tensor upstream = at::randn(c.q.sizes(), at::kDouble);
  for (int64_t window : kWindows) {
    std::vector<at::Tensor> grads[2];
    for (int which = 0; which < 2; ++which) {
      at::Tensor q = c.q.clone().requires_grad_(true), k = c.k.clone().requires_grad_(true),
                 v = c.v.clone().requires_grad_(true);
      const AttentionImpl impl = which == 0 ? AttentionImpl::kSdpa : AttentionImpl::kReference;
      (causal_attention(q, k, v, window, 0, impl, {}, &c.documents) * upstream).sum().backward();
      grads[which] = {q.grad(), k.grad(), v.grad()};
    }
    for (int i = 0; i < 3; ++i)
      EXPECT_LE((grads[0][i] - grads[1][i]).abs().max().item<double>(), 1e-12) << "window " << window << " " << i;
  }
}

// The variable-length stand-in checks what the CUDA kernel requires of its arguments, so that the CPU
// tests would catch a wrong construction: int32 offsets on the tensors' device from 0 to the token count,
// never decreasing, max_seqlen covering every sequence.
TEST(DocumentAttention, StandInChecksTheKernelsArguments) {
  using testing::expect_error;
  const at::Tensor q = at::randn({10, 4, 8}), k = at::randn({10, 2, 8}), v = at::randn({10, 2, 8});
  const FlashArguments args = flash_arguments(0, 8);
  auto run = [&](std::vector<int32_t> cu, int64_t max_seqlen, at::ScalarType type = at::kInt) {
    const FlashSequences s{at::tensor(cu, at::kInt).to(type), max_seqlen};
    return flash_kernel(q, k, v, args, /*cpu_stand_in=*/true, &s);
  };
  EXPECT_EQ(run({0, 4, 10}, 6).sizes(), q.sizes());
  expect_error([&] { run({0, 4, 10}, 6, at::kLong); }, {"int32"});
  expect_error([&] { run({0, 4, 9}, 6); }, {"from 0 to the token count 10"});
  expect_error([&] { run({0, 6, 4, 10}, 6); }, {"must not decrease"});
  expect_error([&] { run({0, 4, 10}, 5); }, {"6 tokens exceeds max_seqlen 5"});
  const FlashSequences ok{at::tensor(std::vector<int32_t>{0, 10}, at::kInt), 10};
  expect_error([&] { flash_kernel(q.view({1, 10, 4, 8}), k, v, args, true, &ok); }, {"[tokens, heads, head_dim]"});
}

TEST(DocumentAttention, NotWithACacheOrPadding) {
  using testing::expect_error;
  const Case c = attention_case(at::kFloat, 3);
  expect_error(
      [&] {
        causal_attention(c.q, c.k, c.v, 0, 0, AttentionImpl::kSdpa, at::ones({2, 1, 30, 30}, at::kBool), &c.documents);
      },
      {"whole training sequences"});
  expect_error([&] { causal_attention(c.q.narrow(2, 29, 1), c.k, c.v, 0, 29, AttentionImpl::kSdpa, {}, &c.documents); },
               {"whole training sequences"});
  expect_error(
      [&] {
        causal_attention(c.q.narrow(0, 0, 1), c.k.narrow(0, 0, 1), c.v.narrow(0, 0, 1), 0, 0, AttentionImpl::kSdpa, {},
                         &c.documents);
      },
      {"documents of a [2, 30] batch"});
}

namespace {

struct Pass {
  at::Tensor logits, loss;
  std::vector<at::Tensor> grads;
};

// The loss of training (next-token labels across the whole row, boundaries included: OLMo-core's labels) on
// logits [B, T, V], then every parameter's gradient.
Pass finish(const CausalLM& model, at::Tensor logits, const at::Tensor& batch) {
  at::Tensor labels = at::full_like(batch, kIgnoreIndex);
  labels.narrow(1, 0, batch.size(1) - 1).copy_(batch.narrow(1, 1, batch.size(1) - 1));
  const LossSums s = next_token_loss(logits, labels, 1e-4);
  Pass p{logits.detach(), ((s.ce_sum + s.z_sum) / static_cast<double>(s.count)).detach(), {}};
  ((s.ce_sum + s.z_sum) / static_cast<double>(s.count)).backward();
  for (const auto& [name, t] : model.parameters()) {
    p.grads.push_back(t.grad().clone());
    t.mutable_grad().reset();
  }
  return p;
}

Pass packed(const CausalLM& model, const at::Tensor& batch, AttentionImpl impl, bool checkpointing = false) {
  SequenceOptions o;
  o.attention = impl;
  o.document_eos_id = kEos;
  o.activation_checkpointing = checkpointing;
  return finish(model, model.forward(batch, o), batch);
}

// Each document through its own forward, at the positions it has in the packed row (positions run across the
// instance, as in OLMo-core for OLMo 3), the logits put back in place.
Pass alone(const CausalLM& model, const at::Tensor& batch) {
  const Documents docs = find_documents(batch, kEos);
  std::vector<at::Tensor> rows;
  for (int64_t b = 0; b < batch.size(0); ++b) {
    std::vector<at::Tensor> pieces;
    for (auto [s, e] : docs.row_spans(b)) {
      SequenceOptions o;
      o.first_position = s;
      pieces.push_back(model.forward(batch.narrow(0, b, 1).narrow(1, s, e - s), o));
    }
    rows.push_back(at::cat(pieces, 1));
  }
  return finish(model, at::cat(rows, 0), batch);
}

ModelConfig small(Variant v) {
  ModelConfig c = preset("tiny", v);  // window 8; layers sliding, sliding, sliding, full
  c.depth_attention_stride = 2;       // Depth-Attention sources across several blocks
  c.depth_attention_recent_window = 1;
  return c;
}

double worst(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) w = std::max(w, (a[i] - b[i]).abs().max().item<double>());
  return w;
}

}  // namespace

// The contract: a packed instance of three documents equals the documents run separately, logits,
// loss and every parameter's gradient within 1e-5 (fp32), for both variants (Depth-Attention mixes across
// layers at one position, so it needs no mask: the siamese_depth runs show it), with the window (8) longer
// than the first document (5 tokens) and shorter than the others (17 and 10; 14 and 12 in row 1).
//
// Why 1e-5 holds: both sides run every token through the same operations on the same values (the same RoPE
// rows, since the document runs at its packed positions; each document's attention over the same keys) except
// that the matmuls sum over another number of rows (GEMM kernels may block them differently) and the softmax
// over its keys in another kernel call: fp32 sums of the same terms in another order, each off by about
// sqrt(n) u of its terms' magnitudes (n <= 192, u = 2^-24: ~1e-6 relative), through a chain of ~50 such
// reductions of values of order 1 (the norms keep the residual stream at RMS ~1) and a head of magnitude
// head_scale ~1: ~1e-6 at most, typically far less. The worst-case first-order bound (forward_bound, as
// Forward.BatchEqualsRows uses) is larger (it assumes every rounding at its maximum and in the same
// direction), and is checked too.
TEST(DocumentMasking, PackedInstanceEqualsEachDocumentAlone) {
  for (Variant v : {Variant::kBase, Variant::kSiameseDepth}) {
    CausalLM model = CausalLM::random_init(small(v), 5);
    for (const auto& [name, p] : model.parameters()) p.requires_grad_(true);
    const int64_t V = model.config().vocab_size;
    const at::Tensor batch = at::stack({packed_row({5, 17, 10}, V, 1), packed_row({6, 14, 12}, V, 2)});
    const Pass expected = alone(model, batch);
    const double logit_bound = tolerance::forward_bound(model, 32);
    for (AttentionImpl impl : {AttentionImpl::kSdpa, AttentionImpl::kReference}) {
      for (bool checkpointing : {false, true}) {
        const Pass got = packed(model, batch, impl, checkpointing);
        const double logits = (got.logits - expected.logits).abs().max().item<double>();
        const double loss = (got.loss - expected.loss).abs().item<double>();
        const double grads = worst(got.grads, expected.grads);
        std::printf("%s %s%s: max |difference| logits %.3g (worst-case bound %.3g), loss %.3g, gradients %.3g\n",
                    variant_name(v), impl == AttentionImpl::kSdpa ? "sdpa" : "reference",
                    checkpointing ? " checkpointed" : "", logits, logit_bound, loss, grads);
        EXPECT_LE(logits, 1e-5) << variant_name(v);
        EXPECT_LE(logits, logit_bound) << variant_name(v);
        EXPECT_LE(loss, 1e-5) << variant_name(v);
        EXPECT_LE(grads, 1e-5) << variant_name(v);
      }
    }
    // Without the mask the later documents read the earlier ones: the comparison can fail.
    SequenceOptions plain;
    const at::Tensor across = model.forward(batch, plain).detach();
    EXPECT_GT((across - expected.logits).abs().max().item<double>(), 1e-3) << variant_name(v);
  }
}

// Rows without an EOS before their end are one document each: the same forward as without masking.
TEST(DocumentMasking, RowsOfOneDocumentAreUnchanged) {
  const CausalLM model = CausalLM::random_init(small(Variant::kBase), 6);
  const at::Tensor batch = at::randint(2, 512, {2, 20}, at::kLong);
  SequenceOptions masked, plain;
  masked.document_eos_id = kEos;
  EXPECT_TRUE(at::equal(model.forward(batch, masked), model.forward(batch, plain)));
}

// Document masking and first_position are fields of whole-sequence forwards only (model/forward_options.h): a
// decoding call, which continues a KV cache, has neither to be given.
TEST(DocumentMasking, NotWithAKvCache) {
  static_assert(testing::TakesDocumentMasking<SequenceOptions>);
  static_assert(!testing::TakesDocumentMasking<DecodeOptions> && !testing::TakesDocumentMasking<AnalysisOptions>);
}

}  // namespace archspace
