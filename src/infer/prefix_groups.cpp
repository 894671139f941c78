#include "archspace/infer/prefix_groups.h"

#include <algorithm>
#include <map>

namespace archspace {

namespace {

int64_t suffix_length(const ScoreRequest& q) { return q.run_length() - q.first_scored; }

// Splits a group's members into runs whose suffix forward fits the budget (see PrefixPlan); a run of one member
// gains nothing from sharing and goes alone.
void split_group(int64_t prefix, const std::vector<size_t>& members, const std::vector<ScoreRequest>& requests,
                 int64_t max_tokens, int64_t max_sequences, std::vector<PrefixGroup>& groups,
                 std::vector<size_t>& alone) {
  PrefixGroup run{prefix, {}, 0};
  auto close = [&] {
    if (run.members.size() >= 2) {
      groups.push_back(run);
    } else {
      alone.insert(alone.end(), run.members.begin(), run.members.end());
    }
    run = {prefix, {}, 0};
  };
  for (size_t i : members) {
    const int64_t longest = std::max(run.longest_suffix, suffix_length(requests[i]));
    const auto rows = static_cast<int64_t>(run.members.size()) + 1;
    const bool fits = rows * (prefix + longest) <= max_tokens && (max_sequences == 0 || rows <= max_sequences);
    if (!fits && !run.members.empty()) close();
    run.members.push_back(i);
    run.longest_suffix = fits ? longest : suffix_length(requests[i]);  // a closed run starts anew with i
  }
  close();
}

}  // namespace

PrefixPlan plan_prefix_sharing(const std::vector<ScoreRequest>& requests, int64_t max_batch_tokens,
                               int64_t max_batch_sequences) {
  PrefixPlan plan;
  // Requests by their unscored prefix, in order of first appearance; a request that runs fewer tokens than its
  // prefix (it scores nothing and wants no next token) has nothing to share.
  std::map<std::vector<uint32_t>, size_t> slot;
  std::vector<std::vector<size_t>> found;
  for (size_t i = 0; i < requests.size(); ++i) {
    const ScoreRequest& q = requests[i];
    if (suffix_length(q) < 0) {
      plan.alone.push_back(i);
      continue;
    }
    std::vector<uint32_t> prefix(q.ids.begin(), q.ids.begin() + q.first_scored);
    const auto [it, added] = slot.emplace(std::move(prefix), found.size());
    if (added) found.emplace_back();
    found[it->second].push_back(i);
  }
  std::vector<PrefixGroup> groups;
  for (const auto& members : found) {
    const int64_t prefix = requests[members.front()].first_scored;
    split_group(prefix, members, requests, max_batch_tokens, max_batch_sequences, groups, plan.alone);
  }
  std::sort(plan.alone.begin(), plan.alone.end());

  // Longest prefix first (the memory peak first, as whole scoring does); then batches filled greedily.
  std::stable_sort(groups.begin(), groups.end(),
                   [](const PrefixGroup& a, const PrefixGroup& b) { return a.prefix > b.prefix; });
  int64_t longest_prefix = 0, longest_suffix = 0, rows = 0;
  for (PrefixGroup& g : groups) {
    const auto members = static_cast<int64_t>(g.members.size());
    if (!plan.batches.empty()) {
      const auto prefixes = static_cast<int64_t>(plan.batches.back().size()) + 1;
      const int64_t suffix = std::max(longest_suffix, g.longest_suffix);
      const bool fits = prefixes * longest_prefix <= max_batch_tokens &&
                        (rows + members) * (longest_prefix + suffix) <= max_batch_tokens &&
                        (max_batch_sequences == 0 || rows + members <= max_batch_sequences);
      if (fits) {
        longest_suffix = suffix;
        rows += members;
        plan.batches.back().push_back(std::move(g));
        continue;
      }
    }
    longest_prefix = g.prefix;
    longest_suffix = g.longest_suffix;
    rows = members;
    plan.batches.push_back({std::move(g)});
  }
  return plan;
}

}  // namespace archspace
