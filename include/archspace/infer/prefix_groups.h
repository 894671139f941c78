// Shared prefixes in scoring: the requests of one multiple-choice document are the same context followed by
// each choice's continuation, and only the continuation is scored. Running the context once for all of them, and
// each continuation on top of its cached keys and values, gives the same log-probabilities (up to summation
// order) for a fraction of the work: a 5-shot context of ~500 tokens and four continuations of ~10 tokens run
// ~540 tokens instead of ~2,040; single-token continuations (the MC format's " A") run the context alone.
//
// This plans that work, without tensors (infer/score.cpp runs it): which requests share their unscored prefix
// ids[0, first_scored), and which of those groups run together in one forward of their prefixes (left-padded, as
// generate's batched prefill) and one of their members' own tokens (right-padded, over the prefixes' cache
// repeated per member).
#pragma once

#include <cstdint>
#include <vector>

#include "archspace/infer/score.h"

namespace archspace {

// Requests (at least two) whose first `prefix` tokens are equal and are exactly what they do not score
// (first_scored == prefix), run as one prefix and `members` suffixes ids[prefix, run) (ScoreRequest::run_length).
struct PrefixGroup {
  int64_t prefix = 0;
  std::vector<size_t> members;  // indices into the requests, ascending
  int64_t longest_suffix = 0;   // tokens the longest member runs after the prefix (0: every member scores one token)
};

struct PrefixPlan {
  // Groups that run together, longest prefix first. A batch's prefixes hold at most max_batch_tokens padded
  // tokens, and its suffix forward at most max_batch_tokens padded tokens counting the cached prefix each member
  // attends over (rows x (longest prefix + longest suffix)): the tokens of scoring those members whole. A group
  // too large for that is split into several, each running the prefix again. At most max_batch_sequences
  // members in a batch (0: no limit).
  std::vector<std::vector<PrefixGroup>> batches;
  std::vector<size_t> alone;  // requests that share their prefix with no other, ascending: scored whole
};

PrefixPlan plan_prefix_sharing(const std::vector<ScoreRequest>& requests, int64_t max_batch_tokens,
                               int64_t max_batch_sequences);

}  // namespace archspace
