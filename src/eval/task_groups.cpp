#include "archspace/eval/task_groups.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "archspace/eval/generation_task_family.h"
#include "archspace/eval/multiple_choice_task_family.h"
#include "archspace/eval/task_files.h"
#include "archspace/util/error.h"
#include "archspace/util/strings.h"

namespace archspace {

namespace {

// The group's row over its members' results in one format and shot count (in the group's order).
TaskResult aggregate(const TaskGroup& group, const std::vector<const TaskResult*>& members) {
  TaskResult g;
  g.task = group.name;
  g.format = members[0]->format;
  g.shots = members[0]->shots;
  g.members = static_cast<int64_t>(members.size());
  const std::string primary = members[0]->primary_metric;
  bool same_primary = true;
  for (const auto* m : members) {
    g.documents += m->documents;
    same_primary &= m->primary_metric == primary;
  }
  // OLMES averages each member's primary score; named as the members name it when they agree.
  g.primary_metric = same_primary ? primary : "primary_score";

  const auto find = [](const TaskResult& r, const std::string& name, bool primary) -> const MetricValue* {
    for (const auto& m : r.metrics) {
      if (primary ? m.primary : m.name == name) return &m;
    }
    return nullptr;
  };
  // The primary first, then each other metric every member has, in the first member's order; each as its
  // macro and its micro average, as OLMES reports <metric>_macro and <metric>_micro for a suite.
  std::vector<std::pair<std::string, bool>> names = {{g.primary_metric, true}};
  for (const auto& m : members[0]->metrics) {
    if (m.primary || m.name == g.primary_metric) continue;
    bool everywhere = true;
    for (const auto* r : members) everywhere &= find(*r, m.name, false) != nullptr;
    if (everywhere) names.emplace_back(m.name, false);
  }
  const auto k = static_cast<double>(members.size());
  const auto n_all = static_cast<double>(g.documents);
  for (const auto& [name, is_primary] : names) {
    MetricValue macro, micro;
    macro.name = micro.name = name;
    macro.primary = is_primary;  // the group's primary is the macro of the members' primary
    macro.aggregate = "macro";
    micro.aggregate = "micro";
    double variance = 0;
    for (const auto* r : members) {
      const MetricValue* m = find(*r, name, is_primary);
      macro.value += m->value;
      variance += m->stderr_ * m->stderr_;  // NaN (one document) makes the group's NaN too
      micro.value += m->value * static_cast<double>(r->documents);
      macro.chance = (r == members[0] ? 0.0 : macro.chance) + m->chance;  // NaN (no chance level) stays NaN
      micro.chance = (r == members[0] ? 0.0 : micro.chance) + m->chance * static_cast<double>(r->documents);
    }
    macro.value /= k;
    macro.chance /= k;
    micro.chance /= n_all;
    macro.stderr_ = std::sqrt(variance) / k;
    micro.value /= n_all;
    // The pooled documents' sum of squares: each member's around its own mean is stderr^2 * n * (n - 1);
    // around the pooled mean it gains n * (mean - pooled)^2.
    double ss = 0;
    for (const auto* r : members) {
      const MetricValue* m = find(*r, name, is_primary);
      const auto n = static_cast<double>(r->documents);
      if (n > 1) ss += m->stderr_ * m->stderr_ * n * (n - 1);
      ss += n * (m->value - micro.value) * (m->value - micro.value);
    }
    micro.stderr_ = n_all > 1 ? std::sqrt(ss / (n_all - 1) / n_all) : std::numeric_limits<double>::quiet_NaN();
    g.metrics.push_back(macro);
    g.metrics.push_back(micro);
  }
  return g;
}

}  // namespace

const std::vector<TaskGroup>& task_groups() {
  static const std::vector<TaskGroup> groups = [] {
    std::vector<TaskGroup> all;
    for (const auto* f : multiple_choice_task_families()) {
      for (auto& g : f->groups()) all.push_back(std::move(g));
    }
    for (const auto* f : generation_task_families()) {
      for (auto& g : f->groups()) all.push_back(std::move(g));
    }
    return all;
  }();
  return groups;
}

const TaskGroup* find_task_group(const std::string& name) {
  for (const auto& g : task_groups()) {
    if (g.name == name) return &g;
  }
  return nullptr;
}

std::vector<std::string> expand_task_groups(const std::vector<std::string>& dirs,
                                            const std::vector<std::string>& names) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  const auto add = [&](const std::string& task) {
    if (seen.insert(task).second) out.push_back(task);
  };
  for (const auto& name : names) {
    if (const TaskGroup* g = find_task_group(name)) {
      std::vector<std::string> missing;
      for (const auto& m : g->members) {
        if (task_variants(dirs, m).empty()) missing.push_back(m);
      }
      if (!missing.empty()) {
        throw Error("task group " + name + ": " + std::to_string(missing.size()) + " of its " +
                    std::to_string(g->members.size()) + " tasks have no files (looked in " + join(dirs) +
                    "): " + join(missing) + g->missing_hint);
      }
      for (const auto& m : g->members) add(m);
    } else if (!task_variants(dirs, name).empty()) {
      add(name);
    } else {
      // The valid names: the groups (with their first and last member), then the tasks outside any group.
      std::set<std::string> members;
      std::vector<std::string> groups;
      for (const auto& group : task_groups()) {
        members.insert(group.members.begin(), group.members.end());
        groups.push_back(group.name + " (" + std::to_string(group.members.size()) + " tasks: " + group.members.front() +
                         " ... " + group.members.back() + ")");
      }
      std::vector<std::string> tasks;
      for (const auto& t : available_tasks(dirs)) {
        if (!members.count(t)) tasks.push_back(t);
      }
      throw Error("unknown task \"" + name + "\" (looked in " + join(dirs) + "); groups: " + join(groups) +
                  "; tasks: " + (tasks.empty() ? std::string("none (run scripts/setup.sh)") : join(tasks)));
    }
  }
  return out;
}

std::vector<TaskResult> with_group_results(const std::vector<std::string>& names,
                                           const std::vector<TaskResult>& results, std::vector<std::string>* notes) {
  std::vector<TaskResult> out = results;
  std::set<std::string> done;
  for (const auto& name : names) {
    const TaskGroup* group = find_task_group(name);
    if (!group || !done.insert(name).second) continue;
    // The members' results by (format, shots), in the order the slices first appear.
    const std::set<std::string> members(group->members.begin(), group->members.end());
    std::vector<std::pair<std::string, int64_t>> keys;
    std::map<std::pair<std::string, int64_t>, std::map<std::string, const TaskResult*>> slices;
    for (const auto& r : results) {
      if (!members.count(r.task)) continue;
      const auto key = std::make_pair(r.format, r.shots);
      if (!slices.count(key)) keys.push_back(key);
      slices[key][r.task] = &r;
    }
    std::vector<TaskResult> rows;
    for (const auto& key : keys) {
      const auto& by_task = slices.at(key);
      if (by_task.size() != group->members.size()) {
        if (notes) {
          notes->push_back("no " + name + " row for " + key.first + " " + std::to_string(key.second) +
                           "-shot: " + std::to_string(by_task.size()) + " of its " +
                           std::to_string(group->members.size()) + " tasks ran in that format");
        }
        continue;
      }
      std::vector<const TaskResult*> ordered;
      for (const auto& m : group->members) ordered.push_back(by_task.at(m));
      rows.push_back(aggregate(*group, ordered));
    }
    // After the group's last member.
    size_t at = out.size();
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].members == 0 && members.count(out[i].task)) at = i + 1;
    }
    out.insert(out.begin() + static_cast<std::ptrdiff_t>(at), rows.begin(), rows.end());
  }
  return out;
}

}  // namespace archspace
