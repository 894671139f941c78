#include "archspace/model/kv_cache.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstring>

#include "archspace/util/error.h"

namespace archspace {

namespace {

// dst[:, :, index : index + T] = src for src [B, G, T, h]. A decode step's one position on the CPU is a row copy per
// batch row and head: ATen's narrow and copy_ cost several times the copy itself there (twice a layer each step).
// Anything else (a prefill chunk, another device, autograd, mismatched shapes, which copy_ reports) takes copy_.
void write_positions(const at::Tensor& dst, int64_t index, const at::Tensor& src) {
  const bool one_row_each = src.dim() == 4 && dst.dim() == 4 && src.size(2) == 1 && index >= 0 && index < dst.size(2) &&
                            src.size(0) == dst.size(0) && src.size(1) == dst.size(1) && src.size(3) == dst.size(3) &&
                            src.stride(3) == 1 && dst.stride(3) == 1;
  if (!one_row_each || !src.device().is_cpu() || !dst.device().is_cpu() || src.scalar_type() != dst.scalar_type() ||
      (at::GradMode::is_enabled() && (src.requires_grad() || dst.requires_grad()))) {
    dst.narrow(2, index, src.size(2)).copy_(src);
    return;
  }
  const int64_t e = src.element_size();
  const size_t row_bytes = static_cast<size_t>(src.size(3) * e);
  char* d = static_cast<char*>(dst.data_ptr()) + index * dst.stride(2) * e;
  const char* s = static_cast<const char*>(src.const_data_ptr());
  for (int64_t b = 0; b < src.size(0); ++b)
    for (int64_t g = 0; g < src.size(1); ++g)
      std::memcpy(d + (b * dst.stride(0) + g * dst.stride(1)) * e, s + (b * src.stride(0) + g * src.stride(1)) * e,
                  row_bytes);
}

}  // namespace

KVCache::KVCache(const ModelConfig& config, std::vector<int64_t> left_padding)
    : types_(config.layer_types),
      window_(config.sliding_window),
      max_positions_(config.max_position_embeddings),
      left_padding_(std::move(left_padding)),
      layers_(config.num_hidden_layers) {
  for (int64_t pad : left_padding_) {
    if (pad < 0) throw Error("KVCache: left padding must be >= 0, got " + std::to_string(pad));
    if (pad > 0) padded_ = true;
  }
}

at::Tensor KVCache::positions(int64_t tokens, const at::Device& device) const {
  if (fixed_shapes()) {  // from the device's slots, one per row: a captured step's positions move with them
    if (tokens != 1) throw Error("KVCache: a fixed-shape step takes one token per row, got " + std::to_string(tokens));
    const at::Tensor slot = slot_.narrow(0, 0, active_rows_), padding = device_left_padding_.narrow(0, 0, active_rows_);
    return (slot.to(device).view({-1, 1}) - padding.to(device).view({-1, 1})).clamp_min(0);
  }
  auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor slots = at::arange(length_, length_ + tokens, opts);
  if (!padded_) return slots;
  at::Tensor pad = at::tensor(left_padding_, at::kLong).to(device).unsqueeze(1);
  return (slots.unsqueeze(0) - pad).clamp_min(0);
}

at::Tensor KVCache::padding_mask(int64_t tokens, const at::Tensor& key_slots) const {
  const at::Device device = key_slots.device();
  at::Tensor pad = at::tensor(left_padding_, at::kLong).to(device).view({-1, 1, 1, 1});  // [B, 1, 1, 1]
  at::Tensor query_slots = at::arange(length_, length_ + tokens, key_slots.options()).view({1, 1, -1, 1});
  at::Tensor key_is_real = key_slots.view({1, 1, 1, -1}) >= pad;  // [B, 1, 1, S]
  at::Tensor query_is_padding = query_slots < pad;                // [B, 1, T, 1]
  return key_is_real | query_is_padding;
}

at::Tensor KVCache::layer_padding_mask(LayerType type, int64_t tokens, int64_t held,
                                       const std::function<at::Tensor()>& build) {
  MaskMemo& memo = masks_[type == LayerType::kSliding ? 0 : 1];
  if (memo.length != length_ || memo.tokens != tokens || memo.held != held) memo = {length_, tokens, held, build()};
  return memo.mask;
}

void KVCache::reserve(LayerCache& c, const at::Tensor& like, int64_t needed, int64_t limit) {
  const int64_t capacity = c.k.defined() ? c.k.size(2) : 0;
  if (needed <= capacity) return;
  // Double (amortised O(1) per position), but not past `limit` unless `needed` is.
  const int64_t grown = std::max(needed, std::min(limit, std::max(2 * capacity, int64_t{16})));
  std::vector<int64_t> shape = like.sizes().vec();
  shape[2] = grown;
  at::Tensor k = at::empty(shape, like.options()), v = at::empty(shape, like.options());
  if (c.held > 0) {
    k.narrow(2, 0, c.held).copy_(c.k.narrow(2, 0, c.held));
    v.narrow(2, 0, c.held).copy_(c.v.narrow(2, 0, c.held));
  }
  c.k = k;
  c.v = v;
}

KVCache::View KVCache::append(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  const int64_t rows = fixed_shapes() ? active_rows_ : static_cast<int64_t>(left_padding_.size());
  if ((fixed_shapes() || !left_padding_.empty()) && k.size(0) != rows) {
    throw Error("KVCache: batch of " + std::to_string(k.size(0)) + " rows, the cache was made for " +
                std::to_string(rows) + (fixed_shapes() ? " (its active rows)" : ""));
  }
  LayerCache& c = layers_[layer];
  if (fixed_shapes()) return append_fixed(types_[layer], c, k, v);
  return types_[layer] == LayerType::kSliding ? append_sliding(c, k, v) : append_full(c, k, v);
}

void KVCache::fix_shapes(int64_t end_slot, int64_t rows) {
  const LayerCache* held = nullptr;
  for (const LayerCache& c : layers_)
    if (c.k.defined()) held = &c;
  if (!held || length_ == 0) throw Error("KVCache::fix_shapes: the cache holds nothing yet (prefill first)");
  if (end_slot <= length_ || end_slot > max_positions_) {
    throw Error("KVCache::fix_shapes: end slot " + std::to_string(end_slot) + " must be in (" +
                std::to_string(length_) + ", " + std::to_string(max_positions_) +
                "] (the length held, max_position_embeddings)");
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    LayerCache& c = layers_[l];
    if (!c.k.defined()) throw Error("KVCache::fix_shapes: layer " + std::to_string(l) + " holds nothing");
    // slot % capacity is the ring's index wherever a slot can land: a sliding layer either never wraps
    // (capacity >= end_slot) or has capacity == window, as append_sliding lays it out; a full one never wraps.
    // Exactly that many slots (no doubling: a fixed-shape step reads the whole buffer).
    const int64_t needed = std::min(end_slot, types_[l] == LayerType::kSliding ? window_ : max_positions_);
    reserve(c, c.k, needed, needed);
    // Slots not held read as zeros: masked keys have weight 0, and 0 x NaN (at::empty's garbage) would be NaN.
    const int64_t capacity = c.k.size(2);
    if (c.held < capacity) {
      c.k.narrow(2, c.held, capacity - c.held).zero_();
      c.v.narrow(2, c.held, capacity - c.held).zero_();
    }
  }
  const at::Device device = held->k.device();
  const int64_t B = held->k.size(0);
  if (rows != 0 && rows < B)
    throw Error("KVCache::fix_shapes: " + std::to_string(rows) + " rows, fewer than the " + std::to_string(B) +
                " held");
  const int64_t total = std::max(rows, B);
  if (total > B) {  // idle rows after the held ones: zeros, as unheld slots are
    for (LayerCache& c : layers_) {
      c.k = at::cat({c.k, at::zeros({total - B, c.k.size(1), c.k.size(2), c.k.size(3)}, c.k.options())});
      c.v = at::cat({c.v, at::zeros({total - B, c.v.size(1), c.v.size(2), c.v.size(3)}, c.v.options())});
    }
    if (!left_padding_.empty()) left_padding_.resize(total, 0);
  }
  slot_ = at::zeros({total}, at::TensorOptions().dtype(at::kLong).device(device));
  row_slots_.assign(total, 0);
  idle_.assign(total, true);
  for (int64_t b = 0; b < B; ++b) {
    row_slots_[b] = length_;
    idle_[b] = false;
  }
  device_left_padding_ =
      left_padding_.empty() ? at::zeros({total}, slot_.options()) : at::tensor(left_padding_, at::kLong).to(device);
  active_rows_ = total;
  fixed_end_ = end_slot;
  slot_written_for_ = -1;
  forget_masks();
}

void KVCache::advance(int64_t tokens) {
  if (!fixed_shapes()) {
    length_ += tokens;
    return;
  }
  for (size_t b = 0; b < row_slots_.size(); ++b)
    if (!idle_[b]) row_slots_[b] += tokens;
  length_ = *std::max_element(row_slots_.begin(), row_slots_.end());
  ++fixed_steps_;
}

bool KVCache::is_idle(int64_t row) const { return fixed_shapes() && idle_.at(row); }

void KVCache::leave_row(int64_t row) {
  if (!fixed_shapes()) throw Error("KVCache::leave_row: the cache's shapes are not fixed (keep_rows)");
  if (row < 0 || row >= static_cast<int64_t>(idle_.size()))
    throw Error("KVCache::leave_row: row " + std::to_string(row) + " of " + std::to_string(idle_.size()));
  idle_[row] = true;
  row_slots_[row] = 0;  // an idle row writes and reads its slot 0 alone: finite, and never past the end
  if (!left_padding_.empty()) left_padding_[row] = 0;
  device_left_padding_[row].fill_(0);
  length_ = *std::max_element(row_slots_.begin(), row_slots_.end());
  forget_masks();
}

bool KVCache::fits(const KVCache& prefilled, int64_t steps) const {
  return fixed_shapes() && prefilled.length() + steps <= fixed_end_;
}

void KVCache::place_row(int64_t row, const KVCache& prefilled) {
  if (!fixed_shapes()) throw Error("KVCache::place_row: the cache's shapes are not fixed (append_rows)");
  if (row < 0 || row >= static_cast<int64_t>(idle_.size()) || !idle_[row])
    throw Error("KVCache::place_row: row " + std::to_string(row) + " is not an idle row of the batch");
  if (prefilled.types_ != types_ || prefilled.window_ != window_ || prefilled.fixed_shapes() ||
      prefilled.batch_size() != 1 || prefilled.length() == 0)
    throw Error("KVCache::place_row: takes one prefilled row of the same model, without fixed shapes");
  const int64_t length = prefilled.length();
  if (length >= fixed_end_) {
    throw Error("KVCache::place_row: a row of " + std::to_string(length) + " slots does not fit the end slot " +
                std::to_string(fixed_end_) + " the shapes were fixed for");
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    auto [k, v] = prefilled.in_slot_order(static_cast<int64_t>(l));  // [1, G, held, h]: slots length - held ..
    LayerCache& c = layers_[l];
    const int64_t held = k.size(2);
    const at::Tensor index =
        at::arange(length - held, length, at::TensorOptions().dtype(at::kLong).device(c.k.device()))
            .remainder(c.k.size(2));
    c.k.select(0, row).index_copy_(1, index, k[0].to(c.k.options()));
    c.v.select(0, row).index_copy_(1, index, v[0].to(c.v.options()));
  }
  idle_[row] = false;
  row_slots_[row] = length;
  length_ = *std::max_element(row_slots_.begin(), row_slots_.end());
  forget_masks();
}

void KVCache::set_active_rows(int64_t rows) {
  if (!fixed_shapes()) throw Error("KVCache::set_active_rows: the cache's shapes are not fixed (fix_shapes)");
  const int64_t total = static_cast<int64_t>(idle_.size());
  if (rows < 1 || rows > total || rows < rows_in_use()) {
    throw Error("KVCache::set_active_rows: " + std::to_string(rows) + " rows of " + std::to_string(total) + ", " +
                std::to_string(rows_in_use()) + " in use");
  }
  if (rows != active_rows_) forget_masks();
  active_rows_ = rows;
}

int64_t KVCache::rows_in_use() const {
  for (int64_t b = static_cast<int64_t>(idle_.size()); b > 0; --b)
    if (!idle_[b - 1]) return b;
  return 0;
}

void KVCache::move_row(int64_t from, int64_t to) {
  if (!fixed_shapes()) throw Error("KVCache::move_row: the cache's shapes are not fixed (fix_shapes)");
  const int64_t total = static_cast<int64_t>(idle_.size());
  if (from < 0 || from >= total || to < 0 || to >= total || idle_[from] || !idle_[to])
    throw Error("KVCache::move_row: row " + std::to_string(from) + " to " + std::to_string(to) +
                " must go from a row in use to an idle one");
  for (LayerCache& c : layers_) {
    c.k.select(0, to).copy_(c.k.select(0, from));
    c.v.select(0, to).copy_(c.v.select(0, from));
  }
  row_slots_[to] = row_slots_[from];
  idle_[to] = false;
  if (!left_padding_.empty()) left_padding_[to] = left_padding_[from];
  device_left_padding_[to].copy_(device_left_padding_[from]);
  leave_row(from);
}

void KVCache::begin_fixed_step() {
  if (!fixed_shapes()) throw Error("KVCache::begin_fixed_step: the cache's shapes are not fixed (fix_shapes)");
  for (size_t b = 0; b < row_slots_.size(); ++b) {
    if (!idle_[b] && row_slots_[b] >= fixed_end_) {
      throw Error("KVCache: slot " + std::to_string(row_slots_[b]) + " is past the end slot " +
                  std::to_string(fixed_end_) + " the shapes were fixed for");
    }
  }
  slot_.copy_(at::tensor(row_slots_, at::kLong));
  slot_written_for_ = fixed_steps_;
  forget_masks();  // the rows' slots moved: a new mask for this step
}

KVCache::View KVCache::append_fixed(LayerType type, LayerCache& c, const at::Tensor& k, const at::Tensor& v) {
  if (k.size(2) != 1)
    throw Error("KVCache: a fixed-shape step takes one token per row, got " + std::to_string(k.size(2)));
  if (slot_written_for_ != fixed_steps_)
    throw Error("KVCache: a fixed-shape step at slot " + std::to_string(length_) + " without begin_fixed_step()");
  const int64_t capacity = c.k.size(2), rows = active_rows_;
  // The active rows: views of the first rows of the buffers and slots, the same memory at every step with that many.
  const at::Tensor keys = c.k.narrow(0, 0, rows), values = c.v.narrow(0, 0, rows), slots = slot_.narrow(0, 0, rows);
  // Each row writes at its own slot's index.
  const at::Tensor index = slots.remainder(capacity).view({-1, 1, 1, 1}).expand({k.size(0), k.size(1), 1, k.size(3)});
  keys.scatter_(2, index, k);
  values.scatter_(2, index, v);
  c.held = std::min(length_ + 1, capacity);
  View view{keys, values, capacity - 1, {}};
  // In row b, index j holds the latest slot s <= slot_b with s % capacity == j (negative: nothing yet); it is read
  // when it is a real slot of its row, s >= left padding. Every key is within a sliding query's window (capacity
  // <= window).
  view.padding_mask = layer_padding_mask(type, 1, capacity, [&] {
    const at::Tensor j = at::arange(capacity, slot_.options()).view({1, -1});
    const at::Tensor slot = slots.view({-1, 1});
    const at::Tensor slot_of_j = slot - (slot - j).remainder(capacity);  // [rows, capacity]
    return (slot_of_j >= device_left_padding_.narrow(0, 0, rows).view({-1, 1})).view({-1, 1, 1, capacity});
  });
  return view;
}

KVCache::View KVCache::append_full(LayerCache& c, const at::Tensor& k, const at::Tensor& v) {
  const int64_t T = k.size(2), previous = c.held;
  reserve(c, k, previous + T, max_positions_);
  write_positions(c.k, previous, k);
  write_positions(c.v, previous, v);
  c.held = previous + T;
  View view{c.k.narrow(2, 0, c.held), c.v.narrow(2, 0, c.held), previous, {}};
  if (padded_) {
    view.padding_mask = layer_padding_mask(LayerType::kFull, T, c.held, [&] {
      return padding_mask(T, at::arange(c.held, at::TensorOptions().dtype(at::kLong).device(k.device())));
    });
  }
  return view;
}

KVCache::View KVCache::append_sliding(LayerCache& c, const at::Tensor& k, const at::Tensor& v) {
  // Slot s lives at ring index s % window_ (the ring only wraps once it holds window_ positions, and
  // until then index == slot).
  const int64_t T = k.size(2), W = window_, start = length_;
  auto long_opts = at::TensorOptions().dtype(at::kLong).device(k.device());
  if (T == 1) {
    // Decoding: the new key overwrites the one that just left the window; the query sees the whole ring.
    reserve(c, k, std::min(start + 1, W), W);
    const int64_t index = start % W;
    write_positions(c.k, index, k);
    write_positions(c.v, index, v);
    c.held = std::min(start + 1, W);
    View view{c.k.narrow(2, 0, c.held), c.v.narrow(2, 0, c.held), c.held - 1, {}};
    if (padded_) {
      // Ring index j holds the latest slot s <= start with s % W == j.
      view.padding_mask = layer_padding_mask(LayerType::kSliding, 1, c.held, [&] {
        at::Tensor j = at::arange(c.held, long_opts);
        return padding_mask(1, start - (start - j).remainder(W));
      });
    }
    return view;
  }
  // A chunk: its queries see the previous window - 1 positions, in order, then the chunk itself.
  const int64_t keep = std::min(c.held, W - 1);
  at::Tensor k_all = k, v_all = v;
  if (keep > 0) {
    std::vector<at::Tensor> ks, vs;
    for (int64_t s = start - keep; s < start;) {  // at most two contiguous runs of the ring
      const int64_t index = s % W, run = std::min(start - s, c.k.size(2) - index);
      ks.push_back(c.k.narrow(2, index, run));
      vs.push_back(c.v.narrow(2, index, run));
      s += run;
    }
    ks.push_back(k);
    vs.push_back(v);
    k_all = at::cat(ks, 2);
    v_all = at::cat(vs, 2);
  }
  // Store the chunk's last min(T, W) positions.
  const int64_t end = start + T;
  reserve(c, k, std::min(end, W), W);
  for (int64_t s = std::max(start, end - W); s < end;) {
    const int64_t index = s % W, run = std::min(end - s, c.k.size(2) - index);
    c.k.narrow(2, index, run).copy_(k.narrow(2, s - start, run));
    c.v.narrow(2, index, run).copy_(v.narrow(2, s - start, run));
    s += run;
  }
  c.held = std::min(end, W);
  View view{k_all, v_all, keep, {}};
  if (padded_) {
    view.padding_mask = layer_padding_mask(LayerType::kSliding, T, keep,
                                           [&] { return padding_mask(T, at::arange(start - keep, end, long_opts)); });
  }
  return view;
}

int64_t KVCache::batch_size() const {
  if (!left_padding_.empty()) return static_cast<int64_t>(left_padding_.size());
  for (const LayerCache& c : layers_) {
    if (c.k.defined()) return c.k.size(0);
  }
  return 0;
}

std::pair<at::Tensor, at::Tensor> KVCache::in_slot_order(int64_t layer) const {
  const LayerCache& c = layers_[layer];
  if (types_[layer] == LayerType::kSliding && length_ > window_) {
    // A wrapped ring (capacity == window): the oldest slot held, length_ - window_, is at length_ % window_.
    const int64_t oldest = length_ % window_;
    auto unroll = [&](const at::Tensor& t) {
      return at::cat({t.narrow(2, oldest, window_ - oldest), t.narrow(2, 0, oldest)}, 2);
    };
    return {unroll(c.k), unroll(c.v)};
  }
  return {c.k.narrow(2, 0, c.held), c.v.narrow(2, 0, c.held)};  // index == slot
}

void KVCache::store_in_slot_order(int64_t layer, const at::Tensor& k, const at::Tensor& v, int64_t length) {
  LayerCache& c = layers_[layer];
  c.held = k.size(2);
  if (types_[layer] == LayerType::kSliding && length > window_) {
    // Slot length - window_ (the first given) belongs at ring index length % window_.
    c.k = at::roll(k, length % window_, 2).contiguous();
    c.v = at::roll(v, length % window_, 2).contiguous();
  } else {
    c.k = k.contiguous();
    c.v = v.contiguous();
  }
}

void KVCache::keep_rows(const std::vector<int64_t>& rows) {
  if (fixed_shapes()) throw Error("KVCache::keep_rows: rows cannot leave a cache with fixed shapes");
  const int64_t B = batch_size();
  for (int64_t r : rows) {
    if (r < 0 || r >= B) throw Error("KVCache::keep_rows: row " + std::to_string(r) + " of " + std::to_string(B));
  }
  forget_masks();
  if (rows.empty()) {
    for (LayerCache& c : layers_) c = LayerCache{};
    left_padding_.clear();
    padded_ = false;
    length_ = 0;
    return;
  }
  std::vector<int64_t> padding;
  for (int64_t r : rows) padding.push_back(left_padding_.empty() ? 0 : left_padding_[r]);
  // Slots that are padding in every kept row go: the batch keeps the length of its longest sequence.
  const int64_t drop = *std::min_element(padding.begin(), padding.end());
  const int64_t length = length_ - drop;
  if (length_ > 0) {
    for (size_t l = 0; l < layers_.size(); ++l) {
      auto [k, v] = in_slot_order(static_cast<int64_t>(l));
      at::Tensor index = at::tensor(rows, at::kLong).to(k.device());
      const int64_t held = types_[l] == LayerType::kSliding ? std::min(length, window_) : length;
      // The held slots made contiguous first (a view of the buffer is not): index_select then copies whole rows
      // (~6x faster than gathering through the view's strides), and the result is stored as it is.
      k = k.narrow(2, k.size(2) - held, held).contiguous().index_select(0, index);
      v = v.narrow(2, v.size(2) - held, held).contiguous().index_select(0, index);
      store_in_slot_order(static_cast<int64_t>(l), k, v, length);
    }
  }
  for (int64_t& p : padding) p -= drop;
  left_padding_ = padding;
  padded_ = std::any_of(padding.begin(), padding.end(), [](int64_t p) { return p > 0; });
  length_ = length;
}

void KVCache::append_rows(const KVCache& other) { append_rows(std::vector<const KVCache*>{&other}); }

void KVCache::append_rows(const std::vector<const KVCache*>& others) {
  for (const KVCache* other : others) {
    if (other->types_ != types_ || other->window_ != window_)
      throw Error("KVCache::append_rows: caches of different models");
    if (fixed_shapes() || other->fixed_shapes())
      throw Error("KVCache::append_rows: rows cannot join a cache with fixed shapes");
  }
  // The caches with rows, this one first: all of them are copied into the new buffers once (joining one at a
  // time would copy the running batch again for every sequence that joins).
  std::vector<const KVCache*> parts;
  if (batch_size() > 0) parts.push_back(this);
  for (const KVCache* other : others)
    if (other->batch_size() > 0) parts.push_back(other);
  if (parts.empty() || (parts.size() == 1 && parts[0] == this)) return;
  forget_masks();
  if (parts.size() == 1) {  // an empty cache takes the other's rows as they are
    const int64_t rows = parts[0]->batch_size();
    *this = *parts[0];
    forget_masks();
    if (left_padding_.empty()) left_padding_.assign(rows, 0);
    return;
  }
  int64_t length = 0;
  for (const KVCache* cache : parts) length = std::max(length, cache->length_);
  std::vector<int64_t> padding;
  for (const KVCache* cache : parts) {
    for (int64_t b = 0; b < cache->batch_size(); ++b)
      padding.push_back((cache->left_padding_.empty() ? 0 : cache->left_padding_[b]) + length - cache->length_);
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    const int64_t held = types_[l] == LayerType::kSliding ? std::min(length, window_) : length;
    std::vector<at::Tensor> ks, vs;
    for (const KVCache* cache : parts) {
      auto [k, v] = cache->in_slot_order(static_cast<int64_t>(l));
      // The slots this cache lacks at the front are padding for its rows (zeros: masked, and finite).
      const int64_t missing = held - k.size(2);
      if (missing > 0) {
        std::vector<int64_t> shape = k.sizes().vec();
        shape[2] = missing;
        k = at::cat({at::zeros(shape, k.options()), k}, 2);
        v = at::cat({at::zeros(shape, v.options()), v}, 2);
      }
      ks.push_back(k);
      vs.push_back(v);
    }
    store_in_slot_order(static_cast<int64_t>(l), at::cat(ks, 0), at::cat(vs, 0), length);
  }
  left_padding_ = padding;
  padded_ = std::any_of(padding.begin(), padding.end(), [](int64_t p) { return p > 0; });
  length_ = length;
}

int64_t KVCache::bytes() const { return bytes(LayerType::kSliding) + bytes(LayerType::kFull); }

int64_t KVCache::bytes(LayerType type) const {
  int64_t n = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerCache& c = layers_[l];
    if (types_[l] != type || !c.k.defined()) continue;
    n += c.k.numel() * c.k.element_size() + c.v.numel() * c.v.element_size();
  }
  return n;
}

int64_t KVCache::cached_positions(int64_t layer) const { return layers_[layer].held; }

const at::Tensor& KVCache::key_buffer(int64_t layer) const { return layers_.at(layer).k; }

}  // namespace archspace
