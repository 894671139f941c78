// Seed-to-seed statistics of a matched comparison (`archspace compare` with several runs per side, eval/compare.h):
// how much of a convergence difference would survive another seed, and how many seeds per arm a difference of a
// given size needs.
//
// Each run's training loss is smoothed as `plot --smooth W` smooths it (the EMA is linear, so the mean of the runs'
// smoothed curves is the smoothed mean curve compare draws). At the steps every run of both sides logged:
//   - the loss difference B - A at matched tokens (at a quarter, half, three quarters and all of the common steps)
//     and in the final validation loss: with pairs (A and B runs of the same seed: same init and data order), the
//     per-pair differences; without, the difference of the side means;
//   - the tokens-to-reach ratio B/A of a loss level: the side mean curves' first step at or below it.
// Intervals come from resampling seeds: with pairs, each resample draws k pair indices with replacement; without,
// k_A runs of A then k_B of B; the statistic is recomputed on the drawn runs and the interval is the 2.5 and 97.5
// percentiles (numpy.percentile's linear rule) of the resamples where it is defined. The draws are SplitMix64 from
// the state splitmix64_mix(seed + kSeedResampleStream), index = floor(u * n), so that numpy can redraw them. The
// loss differences also get Student's t interval and the two-sided t-test's p: paired (one-sample on the pair
// differences) or Welch's.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace archspace {

inline constexpr uint64_t kSeedResampleStream = uint64_t{1} << 32;

// The standard normal's quantile (inverse CDF) for p in (0, 1).
double normal_quantile(double p);
// Student's t distribution with `dof` > 0 degrees of freedom: CDF and quantile (p in (0, 1)).
double student_t_cdf(double t, double dof);
double student_t_quantile(double p, double dof);

// Seeds per arm for a two-sided test at `alpha` to detect a difference `delta` with probability `power`, given the
// seed-to-seed standard deviation `sd` (paired: of the per-pair differences; else of one arm's runs): the normal
// approximation with Guenther's (1981) correction for the t-test, n = ((z_{1-a/2} + z_{power}) sd / delta)^2 +
// z_{1-a/2}^2 / 2 for a paired (one-sample) test, 2 ((z_{1-a/2} + z_{power}) sd / delta)^2 + z_{1-a/2}^2 / 4 per arm
// for two samples; rounded up, at least 2.
int64_t seeds_needed(double sd, double delta, bool paired, double alpha = 0.05, double power = 0.8);

// The seed-to-seed standard deviation seeds_needed takes, from each run's value of a statistic: paired (a[i] and
// b[i] of one seed), of the pair differences; else the two sides' pooled sample standard deviation.
double seed_spread(const std::vector<double>& a, const std::vector<double>& b, bool paired);

// [{"delta", "seeds_per_arm"}] for each difference in `detect`, from the runs' values (seeds_per_arm null when a
// side has fewer than two runs).
nlohmann::json seeds_needed_rows(const std::vector<double>& a, const std::vector<double>& b, bool paired,
                                 const std::vector<double>& detect);

// One side's runs at the common steps: the tokens of each step and each run's smoothed loss there, and each run's
// final validation loss (nullopt: none logged).
struct SeedSide {
  std::vector<std::string> runs;
  std::vector<double> tokens;
  std::vector<std::vector<double>> smoothed;  // [run][step]
  std::vector<std::optional<double>> final_valid;
};

// The seeds section of compare.json (docs/compare.md, "Several seeds"): `pairs` are (A run, B run) indices of the
// same seed; empty: the sides are compared unpaired.
nlohmann::json seed_convergence(const SeedSide& a, const SeedSide& b,
                                const std::vector<std::pair<size_t, size_t>>& pairs, const std::vector<double>& levels,
                                int64_t resamples, uint64_t seed);

}  // namespace archspace
