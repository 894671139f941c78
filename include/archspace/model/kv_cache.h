// KV cache for incremental decoding.
//
// Full-attention layers keep every position in a buffer that grows by doubling (no per-step copy of the
// whole cache). Sliding layers keep the last sliding_window positions in a ring buffer: a new token
// overwrites the position that just left its window, so their memory is bounded by the window whatever
// the length. For siamese_depth the cached values are the Depth-Attention mixed values (SPEC.md section
// 3.2): nothing else persists between steps.
//
// Batches of sequences of different lengths are left-padded: all rows share one slot index (the cache's
// length), row b's first left_padding[b] slots are padding, and its token at slot s has position
// s - left_padding[b]. Real queries never attend to padding; padding queries attend causally to whatever
// precedes them (their outputs are never used, but must stay finite: a fully masked softmax is NaN, and
// NaN values would leak through zero attention weights).
//
// Continuous batching (the server): rows leave a running batch (keep_rows) and prefilled sequences join
// it (append_rows). Joining left-pads the shorter side so that every row still ends at the shared slot;
// leaving drops the slots that are padding in every remaining row, so the batch's length stays that of
// its longest sequence. Sliding layers' rings are rebuilt for the new slot numbering.
//
// Fixed-shape decoding (fix_shapes): after the prefill, every layer's buffer is reserved once for the rest of
// the generation and a decoding step reads the next slot from a device tensor, not from the host: the step
// writes its key and value at index slot % capacity (index_copy_), its query reads the whole buffer, and a mask
// made on the device from the slot allows the slots held. Each step then launches the same kernels on the same
// memory, which is what a CUDA graph replays (infer/decode_step.h); on the CPU it is the reference of that path.
// Each row has its own write slot and mask (the slot tensor holds one slot per row), so rows join and leave a
// fixed-shape batch without reshaping it: a row leaves (leave_row) to an idle state (slot 0, attending to itself
// only, its slot not advancing), and a prefilled sequence takes an idle row (place_row), its keys and values
// copied into that row's ring at its own slots. length() is then the largest slot of the rows. A step may compute the
// first rows only (set_active_rows: the rest must be idle), on views of the same buffers, so that a batch whose high
// rows went idle runs a smaller step (infer/decode_step.h: a CUDA graph per number of rows, as vLLM captures one per
// batch size); move_row brings a row down into an idle one to make that possible.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "archspace/config/model_config.h"

namespace archspace {

class KVCache {
 public:
  // left_padding: one entry per batch row (empty: no padding, any batch size).
  explicit KVCache(const ModelConfig& config, std::vector<int64_t> left_padding = {});

  // Slots consumed so far (the next token's slot; its position when there is no padding).
  int64_t length() const { return length_; }
  bool padded() const { return padded_; }  // some row has left padding
  const std::vector<int64_t>& left_padding() const { return left_padding_; }

  // RoPE positions of the next `tokens` slots: [tokens] without padding, else [B, tokens] (padding slots
  // get position 0).
  at::Tensor positions(int64_t tokens, const at::Device& device) const;

  struct View {
    at::Tensor k, v;   // [B, G, S, h]: the keys and values this chunk's queries attend over
    int64_t q_offset;  // slot of the first query relative to the first key of the view
    // With padding: [B, 1, T, S] bool, false where a real query would see a padding key. Else undefined.
    at::Tensor padding_mask;
  };
  // Adds a chunk's keys and values [B, G, T, h] for `layer` (called once per layer per forward).
  View append(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  // Marks the chunk as consumed by every layer.
  void advance(int64_t tokens);

  // Rows in the batch (0 before the first forward when built without left_padding).
  int64_t batch_size() const;
  // Keeps only the given rows, in that order (empty: the cache becomes empty, length 0).
  void keep_rows(const std::vector<int64_t>& rows);
  // Adds other's rows after this cache's (same model; both on one device and dtype). A cache with no rows
  // takes other's as they are.
  void append_rows(const KVCache& other);
  // Several caches' rows at once, in order (each row copied once: the scheduler's sequences admitted together).
  void append_rows(const std::vector<const KVCache*>& others);

  // Fixed-shape decoding (above), for the steps that fill slots length() .. end_slot - 1: after a prefill (the
  // layers hold something), end_slot in (length(), max_position_embeddings]. After it rows leave and join only
  // through leave_row and place_row (the batch keeps its shape), not keep_rows and append_rows.
  // rows: the batch's rows from then on (0: those it holds); the added ones are idle.
  void fix_shapes(int64_t end_slot, int64_t rows = 0);
  bool fixed_shapes() const { return fixed_end_ > 0; }
  int64_t fixed_end() const { return fixed_end_; }  // end_slot of fix_shapes (0: not fixed)
  // Writes each row's slot into the device tensor a fixed-shape step reads them from. Outside a captured graph,
  // before each step (a step whose slots were not written for it is refused).
  void begin_fixed_step();
  // Fixed shapes: row `row` leaves (it goes idle: its later steps attend to one slot of their own, never
  // advance, and their outputs are to be ignored). Rows that are idle: is_idle.
  void leave_row(int64_t row);
  bool is_idle(int64_t row) const;
  // Fixed shapes: the one row of `prefilled` (a cache without fixed shapes, same model) takes the idle row `row`,
  // at its own slots 0 .. prefilled.length() - 1; its later steps fill slots from prefilled.length() on, which
  // must stay below fixed_end() (fits says whether `steps` more do).
  void place_row(int64_t row, const KVCache& prefilled);
  bool fits(const KVCache& prefilled, int64_t steps) const;
  // Fixed shapes: the next steps compute rows 0 .. rows - 1 only (their ids [rows, 1]); every row from `rows` on must
  // be idle. fix_shapes starts with every row.
  void set_active_rows(int64_t rows);
  int64_t active_rows() const { return active_rows_; }
  // Fixed shapes: 1 + the highest row that is not idle (0 when all are).
  int64_t rows_in_use() const;
  // Fixed shapes: row `from` (not idle) moves to the idle row `to` (its keys, values, slot and padding), and `from`
  // goes idle. Its later steps give what they would have given in `from`.
  void move_row(int64_t from, int64_t to);

  int64_t bytes() const;                          // allocated by all layers
  int64_t bytes(LayerType type) const;            // allocated by layers of one type
  int64_t cached_positions(int64_t layer) const;  // positions a layer holds
  // The buffer a layer's keys are kept in, [B, G, capacity, h] (undefined before its first append).
  const at::Tensor& key_buffer(int64_t layer) const;

 private:
  struct LayerCache {
    at::Tensor k, v;   // [B, G, capacity, h]; for a sliding layer slot s lives at s % capacity once full
    int64_t held = 0;  // positions held
  };
  View append_full(LayerCache& c, const at::Tensor& k, const at::Tensor& v);
  View append_sliding(LayerCache& c, const at::Tensor& k, const at::Tensor& v);
  // Grows c's buffers to hold `needed` positions, keeping the first c.held; doubling stops at `limit`
  // (the window for a sliding layer, max_position_embeddings for a full one).
  void reserve(LayerCache& c, const at::Tensor& like, int64_t needed, int64_t limit);
  // A layer's cached keys and values in slot order: slots [length_ - held, length_) as [B, G, held, h].
  std::pair<at::Tensor, at::Tensor> in_slot_order(int64_t layer) const;
  // Replaces a layer's cache with keys and values in slot order ending at slot `length` (the inverse of
  // in_slot_order for that length: sliding layers get their ring layout back).
  void store_in_slot_order(int64_t layer, const at::Tensor& k, const at::Tensor& v, int64_t length);
  // Padding mask for queries at slots length_ .. length_ + T - 1 over keys at the given slots [S].
  at::Tensor padding_mask(int64_t tokens, const at::Tensor& key_slots) const;
  // The padding mask of a layer's view, built once per forward and layer type: every layer of a type
  // sees the same slots, and a decode step would otherwise rebuild it (seven small ops) in every layer.
  at::Tensor layer_padding_mask(LayerType type, int64_t tokens, int64_t held, const std::function<at::Tensor()>& build);
  struct MaskMemo {
    int64_t length = -1, tokens = 0, held = 0;  // for which view (length -1: none)
    at::Tensor mask;
  };
  void forget_masks() { masks_[0] = masks_[1] = MaskMemo{}; }  // the padding changed
  // A fixed-shape step of one token: written at slot % capacity, the whole buffer read under the mask of the
  // slots held (real ones: not left padding).
  View append_fixed(LayerType type, LayerCache& c, const at::Tensor& k, const at::Tensor& v);

  std::vector<LayerType> types_;
  int64_t window_;
  int64_t max_positions_;
  std::vector<int64_t> left_padding_;
  bool padded_ = false;
  int64_t length_ = 0;
  std::vector<LayerCache> layers_;
  MaskMemo masks_[2];               // sliding, full
  int64_t fixed_end_ = 0;           // fix_shapes' end slot (0: shapes follow the length)
  at::Tensor slot_;                 // [B] int64 on the cache's device: each row's slot in a fixed-shape step
  at::Tensor device_left_padding_;  // [B] int64 on that device (zeros without padding)
  std::vector<int64_t> row_slots_;  // fixed shapes: each row's next slot (0 for an idle row)
  std::vector<bool> idle_;          // fixed shapes: rows that left
  int64_t fixed_steps_ = 0;         // fixed-shape steps begun (the mask memo's key)
  int64_t slot_written_for_ = -1;   // the step begin_fixed_step wrote slot_ for
  int64_t active_rows_ = 0;         // fixed shapes: the rows a step computes (set_active_rows)
};

}  // namespace archspace
