// `archspace compare`: two sides (A and B, one or several runs each, e.g. several seeds) of a matched
// comparison: whether the runs were matched (batch hashes step for step, schedule, seed, tokens, evaluation
// settings), how fast each converges (tokens to reach loss levels), and the paired per-task differences of
// their downstream evaluations (`eval downstream --requests-out` rows joined by (task, doc_id)) with seeded
// paired-bootstrap intervals, McNemar's exact test for 0/1 metrics and Holm's correction across the tasks.
//
// The bootstrap's random numbers are SplitMix64 (Steele, Lea and Flood 2014), so that a test can draw the same
// resamples in numpy: task t (in sorted task order) draws from the stream whose state starts at
// splitmix64_mix(seed + t); each resample draws, for several runs per side, first k_A run indices of A, then
// k_B of B, then the n instance indices (instances in the order of A's first file), each index floor(u * n) with
// u = (x >> 11) * 2^-53 of the next output x.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace archspace {

// ---- statistics -------------------------------------------------------------------------------------

// SplitMix64's output function of a state.
uint64_t splitmix64_mix(uint64_t z);
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t next() { return splitmix64_mix(state_ += 0x9E3779B97F4A7C15ULL); }
  // An index in [0, n): floor(u * n), u the next output's top 53 bits as a fraction.
  int64_t index(int64_t n) {
    return static_cast<int64_t>(static_cast<double>(next() >> 11) * 0x1.0p-53 * static_cast<double>(n));
  }

 private:
  uint64_t state_;
};

// numpy.percentile's default (linear) quantile, q in [0, 1], of `sorted` values.
double linear_quantile(const std::vector<double>& sorted, double q);

// McNemar's exact test of paired 0/1 outcomes: `b` pairs where only A is right, `c` where only B is: the
// two-sided binomial test of c successes in b + c trials at p = 1/2 (1 when b + c = 0).
double mcnemar_exact_p(int64_t b, int64_t c);

// Holm's step-down adjusted p-values, in the order given.
std::vector<double> holm_adjust(const std::vector<double>& p);

// The smoothing of `archspace plot --smooth W`: TensorBoard's debiased exponential moving average.
std::vector<double> ema_smooth(const std::vector<double>& values, double weight);

// The tokens at the first point whose loss is at or below `level`; nullopt when the curve never reaches it.
std::optional<double> tokens_to_reach(const std::vector<double>& tokens, const std::vector<double>& loss, double level);

// One task's per-instance values of both sides: a[r][i] is run r of side A on instance i (B likewise, the
// same instances in the same order).
struct PairedTask {
  std::string task, metric;
  std::vector<std::vector<double>> a, b;
};

struct PairedResult {
  double mean_a = 0, mean_b = 0, diff = 0, low = 0, high = 0;
  double p = 1;
  std::string test;                // "mcnemar_exact" or "bootstrap"
  int64_t only_a = 0, only_b = 0;  // McNemar's discordant pairs (one run per side, 0/1 metrics)
  std::vector<double> resampled;   // the resamples' differences, in draw order
};

// The paired bootstrap of one task (see the top of this file for the draws), the interval at `level`.
PairedResult paired_bootstrap(const PairedTask& task, int64_t resamples, uint64_t seed, int64_t task_index,
                              double level = 0.95);

// ---- the comparison ---------------------------------------------------------------------------------

struct CompareOptions {
  std::vector<std::string> a, b;            // run directories per side (one or several seeds)
  std::vector<std::string> eval_a, eval_b;  // requests-out files per side (one per run), else RUN/requests.jsonl
  bool intersect = false;                   // drop (and count) instances that only one side has or whose gold differs
  int64_t resamples = 10000;
  uint64_t seed = 0;
  double smooth = 0.6;         // plot --smooth's weight for the training loss
  std::vector<double> levels;  // loss levels for tokens-to-reach; empty: chosen from the curves
  std::string suite;           // an evaluation suite (eval/suites.h): its table of paired differences too
};

// The whole report as compare.json holds it (docs/compare.md); throws Error naming file and line on bad input.
nlohmann::json compare_runs(const CompareOptions& options);

// compare.md: the report as Markdown, the differences first.
std::string compare_markdown(const nlohmann::json& report);

}  // namespace archspace
