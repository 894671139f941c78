#include "archspace/data/mixture_schedule.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

#include "archspace/util/error.h"

namespace archspace {

namespace {

using u128 = unsigned __int128;

uint64_t floor_div(u128 a, u128 b) { return static_cast<uint64_t>(a / b); }
uint64_t ceil_div(u128 a, u128 b) { return static_cast<uint64_t>((a + b - 1) / b); }

// Subtask i (1-based) of a Pfair task of weight e / p: it must run in slots [release, deadline).
struct Subtask {
  uint64_t release, deadline;
  bool overlaps_next;       // PD^2's b-bit: the next subtask's window starts in this one's last slot
  uint64_t group_deadline;  // PD^2's D for heavy tasks (1/2 <= e/p < 1), else 0
};

Subtask subtask(uint64_t i, uint64_t e, uint64_t p) {
  Subtask t;
  t.release = floor_div(u128(i - 1) * p, e);
  t.deadline = ceil_div(u128(i) * p, e);
  t.overlaps_next = (u128(i) * p) % e != 0;
  t.group_deadline = 0;
  if (2 * e >= p && e < p) {
    // Anderson and Srinivasan's closed form, D = ceil(ceil(d (1 - w)) / (1 - w)) with w = e / p (the end of
    // the cascade of overlapping 2-slot windows). A wrong priority shows as a missed deadline below (an
    // internal error) and in the lag bounds tests/unit/test_mixture.cpp checks.
    const uint64_t x = ceil_div(u128(t.deadline) * (p - e), p);
    t.group_deadline = ceil_div(u128(x) * p, p - e);
  }
  return t;
}

}  // namespace

std::vector<uint64_t> apportion(uint64_t total, const std::vector<double>& weights) {
  double sum = 0;
  for (double w : weights) {
    if (!(w >= 0) || !std::isfinite(w)) throw Error("apportion: weights must be finite and >= 0");
    sum += w;
  }
  if (weights.empty() || sum <= 0) throw Error("apportion: the weights sum to 0");
  std::vector<uint64_t> out(weights.size());
  std::vector<double> remainder(weights.size());
  uint64_t given = 0;
  for (size_t s = 0; s < weights.size(); ++s) {
    const double quota = static_cast<double>(total) * (weights[s] / sum);
    out[s] = std::min<uint64_t>(static_cast<uint64_t>(std::floor(quota)), total);
    remainder[s] = quota - static_cast<double>(out[s]);
    given += out[s];
  }
  std::vector<size_t> order(weights.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return remainder[a] > remainder[b]; });
  // Rounding may leave the floors a unit above or below the total: take from the smallest remainders,
  // give to the largest.
  for (size_t i = 0; given < total; i = (i + 1) % order.size()) {
    ++out[order[i]];
    ++given;
  }
  for (size_t i = order.size(); given > total;) {
    i = (i + order.size() - 1) % order.size();
    if (out[order[i]] > 0) {
      --out[order[i]];
      --given;
    }
  }
  return out;
}

MixtureSchedule::MixtureSchedule(std::vector<uint64_t> counts, uint64_t global_batch)
    : counts_(std::move(counts)), batch_(global_batch) {
  for (uint64_t n : counts_) total_ += n;
  if (counts_.empty() || counts_.size() > 64)
    throw Error("mixture schedule: 1 to 64 sources, not " + std::to_string(counts_.size()));
  if (batch_ == 0 || total_ == 0 || total_ % batch_ != 0) {
    throw Error("mixture schedule: " + std::to_string(total_) +
                " instances are not a positive multiple of the global batch " + std::to_string(batch_));
  }
  batches_ = total_ / batch_;
  uint64_t remainders = 0;
  for (uint64_t n : counts_) {
    base_.push_back(n / batches_);
    remainder_.push_back(n % batches_);
    remainders += n % batches_;
  }
  processors_ = remainders / batches_;  // exact: sum n_s = B G, so sum (n_s mod B) = B (G - sum floor(n_s / B))
  // Level 1 once through, keeping the running extras every kSnapshotEvery batches.
  std::vector<uint64_t> done(counts_.size(), 0);
  for (uint64_t b = 0; b < batches_; ++b) {
    if (b % kSnapshotEvery == 0) snapshots_.push_back(done);
    const uint64_t mask = extras(b, done);
    for (size_t s = 0; s < counts_.size(); ++s) done[s] += (mask >> s) & 1;
  }
  for (size_t s = 0; s < counts_.size(); ++s) {
    if (done[s] != remainder_[s]) throw Error("mixture schedule: internal error (PD^2 left extras unscheduled)");
  }
}

// PD^2 at slot b: the `processors_` eligible subtasks of highest priority (earliest deadline; then the one
// whose window overlaps the next; then the later group deadline; then the lower source index).
uint64_t MixtureSchedule::extras(uint64_t b, const std::vector<uint64_t>& done_before) const {
  std::vector<std::tuple<uint64_t, int, uint64_t, size_t>> eligible;  // (deadline, -b-bit, -D, source)
  for (size_t s = 0; s < counts_.size(); ++s) {
    const uint64_t e = remainder_[s];
    if (e == 0 || done_before[s] >= e) continue;
    const Subtask t = subtask(done_before[s] + 1, e, batches_);
    if (t.release > b) continue;
    eligible.emplace_back(t.deadline, t.overlaps_next ? 0 : 1, UINT64_MAX - t.group_deadline, s);
  }
  if (eligible.size() < processors_) throw Error("mixture schedule: internal error (PD^2 short of eligible work)");
  std::sort(eligible.begin(), eligible.end());
  uint64_t mask = 0;
  for (uint64_t i = 0; i < processors_; ++i) {
    const auto& [deadline, bit, group, s] = eligible[i];
    if (deadline <= b) throw Error("mixture schedule: internal error (PD^2 missed a deadline)");
    mask |= uint64_t(1) << s;
  }
  return mask;
}

std::vector<uint64_t> MixtureSchedule::extras_before(uint64_t b) const {
  std::vector<uint64_t> done = snapshots_.empty()
                                   ? std::vector<uint64_t>(counts_.size(), 0)
                                   : snapshots_[std::min<uint64_t>(b / kSnapshotEvery, snapshots_.size() - 1)];
  for (uint64_t i = std::min<uint64_t>(b / kSnapshotEvery, snapshots_.size() - 1) * kSnapshotEvery; i < b; ++i) {
    const uint64_t mask = extras(i, done);
    for (size_t s = 0; s < counts_.size(); ++s) done[s] += (mask >> s) & 1;
  }
  return done;
}

std::vector<uint64_t> MixtureSchedule::before_batch(uint64_t b) const {
  if (b > batches_) throw Error("mixture schedule: batch " + std::to_string(b) + " out of range");
  std::vector<uint64_t> out = extras_before(b);
  for (size_t s = 0; s < counts_.size(); ++s) out[s] += b * base_[s];
  return out;
}

std::vector<uint64_t> MixtureSchedule::in_batch(uint64_t b) const {
  if (b >= batches_) throw Error("mixture schedule: batch " + std::to_string(b) + " out of range");
  const uint64_t mask = extras(b, extras_before(b));
  std::vector<uint64_t> out(counts_.size());
  for (size_t s = 0; s < counts_.size(); ++s) out[s] = base_[s] + ((mask >> s) & 1);
  return out;
}

// Earliest deadline first among the batch's instances: the next instance of each source that still has
// some in this batch, released by its ideal time if any is; else the earliest released.
std::vector<MixtureSchedule::Slot> MixtureSchedule::batch_slots(uint64_t b) const {
  const std::vector<uint64_t> before = before_batch(b), quota = in_batch(b);
  std::vector<uint64_t> taken(counts_.size(), 0);
  std::vector<Slot> slots(batch_);
  for (uint64_t q = 0; q < batch_; ++q) {
    const uint64_t position = b * batch_ + q;
    std::tuple<int, uint64_t, int, size_t> best{2, 0, 0, 0};  // (not released, deadline or release, -b-bit, s)
    for (size_t s = 0; s < counts_.size(); ++s) {
      if (taken[s] >= quota[s]) continue;
      const Subtask t = subtask(before[s] + taken[s] + 1, counts_[s], total_);
      const bool released = t.release <= position;
      const std::tuple<int, uint64_t, int, size_t> key{released ? 0 : 1, released ? t.deadline : t.release,
                                                       t.overlaps_next ? 0 : 1, s};
      best = std::min(best, key);
    }
    const size_t s = std::get<3>(best);
    slots[q] = {static_cast<uint32_t>(s), before[s] + taken[s]};
    ++taken[s];
  }
  return slots;
}

MixtureSchedule::Slot MixtureSchedule::at(uint64_t position) const {
  if (position >= total_) throw Error("mixture schedule: position " + std::to_string(position) + " out of range");
  const uint64_t b = position / batch_;
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cached_batch_ != b) {
    cached_slots_ = batch_slots(b);
    cached_batch_ = b;
  }
  return cached_slots_[position % batch_];
}

}  // namespace archspace
