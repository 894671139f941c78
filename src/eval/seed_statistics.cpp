#include "archspace/eval/seed_statistics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "archspace/eval/compare.h"
#include "archspace/util/error.h"

namespace archspace {

using json = nlohmann::json;

// ---- distributions ----------------------------------------------------------------------------------------

// Acklam's rational approximation, then one Halley step on the exact CDF (0.5 erfc(-x / sqrt 2)): full double
// precision over (0, 1).
double normal_quantile(double p) {
  if (!(p > 0 && p < 1)) throw Error("normal_quantile: p must be in (0, 1)");
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  const double low = 0.02425;
  double x;
  if (p < low) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p <= 1 - low) {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    const double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  const double e = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
  const double u = e * std::sqrt(2 * M_PI) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

namespace {

// The continued fraction of the regularized incomplete beta function (modified Lentz), for x < (a + 1) / (a + b + 2).
double beta_fraction(double a, double b, double x) {
  const double tiny = 1e-300;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  if (std::abs(d) < tiny) d = tiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 10000; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((a + m2 - 1) * (a + m2));
    d = 1 + aa * d;
    c = 1 + aa / c;
    d = 1 / (std::abs(d) < tiny ? tiny : d);
    c = std::abs(c) < tiny ? tiny : c;
    h *= d * c;
    aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1));
    d = 1 + aa * d;
    c = 1 + aa / c;
    d = 1 / (std::abs(d) < tiny ? tiny : d);
    c = std::abs(c) < tiny ? tiny : c;
    const double delta = d * c;
    h *= delta;
    if (std::abs(delta - 1) < 1e-16) break;
  }
  return h;
}

// I_x(a, b), the regularized incomplete beta function.
double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front =
      std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1) / (a + b + 2)) return front * beta_fraction(a, b, x) / a;
  return 1 - front * beta_fraction(b, a, 1 - x) / b;
}

}  // namespace

double student_t_cdf(double t, double dof) {
  if (!(dof > 0)) throw Error("student_t_cdf: the degrees of freedom must be positive");
  if (std::isinf(t)) return t > 0 ? 1 : 0;
  const double tail = 0.5 * incomplete_beta(dof / 2, 0.5, dof / (dof + t * t));  // P(T > |t|)
  return t > 0 ? 1 - tail : tail;
}

double student_t_quantile(double p, double dof) {
  if (!(p > 0 && p < 1)) throw Error("student_t_quantile: p must be in (0, 1)");
  double lo = -1, hi = 1;
  while (student_t_cdf(lo, dof) > p) lo *= 2;
  while (student_t_cdf(hi, dof) < p) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-15 * std::max(1.0, std::abs(lo)); ++i) {
    const double mid = 0.5 * (lo + hi);
    (student_t_cdf(mid, dof) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

int64_t seeds_needed(double sd, double delta, bool paired, double alpha, double power) {
  if (!(delta > 0)) throw Error("seeds_needed: the difference to detect must be positive");
  if (!(sd >= 0)) throw Error("seeds_needed: the standard deviation must be at least 0");
  const double za = normal_quantile(1 - alpha / 2), zb = normal_quantile(power);
  const double base = std::pow((za + zb) * sd / delta, 2);
  const double n = paired ? base + za * za / 2 : 2 * base + za * za / 4;
  return std::max<int64_t>(2, static_cast<int64_t>(std::ceil(n - 1e-9)));
}

// ---- the seeds section --------------------------------------------------------------------------------------

namespace {

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

double sample_sd(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

// b[i] - a[i] of each pair.
std::vector<double> pair_differences(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d;
  for (size_t i = 0; i < a.size(); ++i) d.push_back(b[i] - a[i]);
  return d;
}

// One resample's (or the whole set's) runs: A's and B's run indices.
struct Picks {
  std::vector<size_t> a, b;
};

std::vector<double> mean_curve(const SeedSide& side, const std::vector<size_t>& pick) {
  std::vector<double> out(side.tokens.size(), 0.0);
  for (size_t r : pick) {
    for (size_t j = 0; j < out.size(); ++j) out[j] += side.smoothed[r][j];
  }
  for (double& v : out) v /= static_cast<double>(pick.size());
  return out;
}

// The statistics one set of picks gives: the loss difference at each checkpoint, in the final validation loss, and
// the tokens-to-reach ratio of each level (NaN where undefined).
struct Statistics {
  std::vector<double> at, ratio;
  double valid = std::numeric_limits<double>::quiet_NaN();
};

Statistics statistics(const SeedSide& a, const SeedSide& b, const Picks& p, const std::vector<size_t>& checkpoints,
                      const std::vector<double>& levels, bool have_valid) {
  Statistics s;
  const std::vector<double> ca = mean_curve(a, p.a), cb = mean_curve(b, p.b);
  for (size_t j : checkpoints) s.at.push_back(cb[j] - ca[j]);
  for (double level : levels) {
    const auto ta = tokens_to_reach(a.tokens, ca, level), tb = tokens_to_reach(b.tokens, cb, level);
    s.ratio.push_back(ta && tb && *ta > 0 ? *tb / *ta : std::numeric_limits<double>::quiet_NaN());
  }
  if (have_valid) {
    double va = 0, vb = 0;
    for (size_t r : p.a) va += *a.final_valid[r];
    for (size_t r : p.b) vb += *b.final_valid[r];
    s.valid = vb / static_cast<double>(p.b.size()) - va / static_cast<double>(p.a.size());
  }
  return s;
}

// The percentile interval of the defined resamples (NaN excluded), and how many were defined.
json percentile_interval(std::vector<double> values) {
  values.erase(std::remove_if(values.begin(), values.end(), [](double v) { return std::isnan(v); }), values.end());
  if (values.empty()) return {{"low", nullptr}, {"high", nullptr}, {"defined", 0}};
  std::sort(values.begin(), values.end());
  return {
      {"low", linear_quantile(values, 0.025)}, {"high", linear_quantile(values, 0.975)}, {"defined", values.size()}};
}

// Student's t interval and two-sided p of a difference: paired (the pair differences) or Welch's (the two sides).
json t_test(const std::vector<double>& a, const std::vector<double>& b, bool paired) {
  double diff, se, dof;
  if (paired) {
    const std::vector<double> d = pair_differences(a, b);
    if (d.size() < 2) return nullptr;
    diff = mean(d);
    se = sample_sd(d) / std::sqrt(static_cast<double>(d.size()));
    dof = static_cast<double>(d.size() - 1);
  } else {
    if (a.size() < 2 || b.size() < 2) return nullptr;
    const double va = std::pow(sample_sd(a), 2) / static_cast<double>(a.size());
    const double vb = std::pow(sample_sd(b), 2) / static_cast<double>(b.size());
    diff = mean(b) - mean(a);
    se = std::sqrt(va + vb);
    dof = (va + vb) * (va + vb) /
          (va * va / static_cast<double>(a.size() - 1) + vb * vb / static_cast<double>(b.size() - 1));
  }
  if (!(se > 0)) return {{"low", diff}, {"high", diff}, {"p", diff == 0 ? 1.0 : 0.0}, {"dof", dof}};
  const double crit = student_t_quantile(0.975, dof);
  return {{"low", diff - crit * se},
          {"high", diff + crit * se},
          {"p", 2 * student_t_cdf(-std::abs(diff / se), dof)},
          {"dof", dof}};
}

// A difference's row: its value, the seed-resampled interval, the t interval and p, the spread and the seeds per
// arm each of `detect` would need.
json difference_row(double diff, const std::vector<double>& resampled, const std::vector<double>& a,
                    const std::vector<double>& b, bool paired, const std::vector<double>& detect) {
  json row = {{"a", mean(a)}, {"b", mean(b)}, {"diff", diff}, {"bootstrap", percentile_interval(resampled)}};
  row["t"] = t_test(a, b, paired);
  row["sd"] = seed_spread(a, b, paired);
  std::vector<double> deltas = detect;
  if (diff != 0) deltas.push_back(std::abs(diff));  // and a difference of the size observed
  row["seeds_needed"] = seeds_needed_rows(a, b, paired, deltas);
  if (diff != 0) row["seeds_needed"].back()["observed"] = true;
  return row;
}

// Each side's t band: at each step the mean smoothed loss +- t_{0.975, k-1} sd / sqrt(k) over its runs.
json band(const SeedSide& s) {
  const size_t k = s.smoothed.size();
  if (k < 2) return nullptr;
  const double crit = student_t_quantile(0.975, static_cast<double>(k - 1));
  std::vector<double> means, low, high;
  for (size_t j = 0; j < s.tokens.size(); ++j) {
    std::vector<double> v;
    for (const auto& run : s.smoothed) v.push_back(run[j]);
    const double m = mean(v), half = crit * sample_sd(v) / std::sqrt(static_cast<double>(k));
    means.push_back(m);
    low.push_back(m - half);
    high.push_back(m + half);
  }
  return {{"mean", means}, {"low", low}, {"high", high}};
}

}  // namespace

double seed_spread(const std::vector<double>& a, const std::vector<double>& b, bool paired) {
  if (paired) return sample_sd(pair_differences(a, b));
  return std::sqrt((std::pow(sample_sd(a), 2) + std::pow(sample_sd(b), 2)) / 2);
}

json seeds_needed_rows(const std::vector<double>& a, const std::vector<double>& b, bool paired,
                       const std::vector<double>& detect) {
  const bool enough = paired ? a.size() >= 2 : a.size() >= 2 && b.size() >= 2;
  const double sd = seed_spread(a, b, paired);
  json needed = json::array();
  for (double d : detect)
    needed.push_back({{"delta", d}, {"seeds_per_arm", enough ? json(seeds_needed(sd, d, paired)) : json()}});
  return needed;
}

namespace {

// The common steps at a quarter, half, three quarters and the end of the run (each once).
std::vector<size_t> quarter_steps(size_t n) {
  std::vector<size_t> steps;
  for (double q : {0.25, 0.5, 0.75, 1.0}) {
    const auto j = static_cast<size_t>(std::llround(q * static_cast<double>(n - 1)));
    if (steps.empty() || steps.back() != j) steps.push_back(j);
  }
  return steps;
}

// Every run of each side once: the pairs' runs when paired, else each side's runs in order.
Picks every_run(const SeedSide& a, const SeedSide& b, const std::vector<std::pair<size_t, size_t>>& pairs) {
  Picks all;
  if (!pairs.empty()) {
    for (const auto& [i, j] : pairs) {
      all.a.push_back(i);
      all.b.push_back(j);
    }
  } else {
    for (size_t i = 0; i < a.smoothed.size(); ++i) all.a.push_back(i);
    for (size_t i = 0; i < b.smoothed.size(); ++i) all.b.push_back(i);
  }
  return all;
}

// One resample: k pair indices (paired), else k_A runs of A then k_B of B, with replacement.
Picks draw_runs(SplitMix64& rng, const Picks& all, const std::vector<std::pair<size_t, size_t>>& pairs) {
  Picks p;
  if (!pairs.empty()) {
    for (size_t i = 0; i < pairs.size(); ++i) {
      const auto& pair = pairs[static_cast<size_t>(rng.index(static_cast<int64_t>(pairs.size())))];
      p.a.push_back(pair.first);
      p.b.push_back(pair.second);
    }
  } else {
    for (size_t i = 0; i < all.a.size(); ++i)
      p.a.push_back(static_cast<size_t>(rng.index(static_cast<int64_t>(all.a.size()))));
    for (size_t i = 0; i < all.b.size(); ++i)
      p.b.push_back(static_cast<size_t>(rng.index(static_cast<int64_t>(all.b.size()))));
  }
  return p;
}

// How the convergence is resampled and tested, as the report states it.
json convergence_method(bool paired, int64_t resamples, uint64_t seed) {
  return {
      {"paired", paired},
      {"resamples", resamples},
      {"seed", seed},
      {"rng",
       "SplitMix64 from state splitmix64_mix(seed + 2^32); index = floor(u * n), u = (x >> 11) * 2^-53; "
       "per resample k pair indices (paired), else k_A runs of A then k_B of B"},
      {"method",
       paired ? "pairs matched by seed (same init and data order), resampled with replacement; the statistic on the "
                "drawn pairs; percentile interval over the resamples where it is defined; t: paired t-test on the "
                "pair differences"
              : "each side's runs resampled with replacement; percentile interval over the resamples where it is "
                "defined; t: Welch's t-test"},
      {"seeds_needed_rule",
       "for a two-sided test at 5% with 80% power: the normal approximation with Guenther's (1981) "
       "t correction, n = ((z_0.975 + z_0.8) sd / delta)^2 + z_0.975^2 / 2 (paired, sd of the pair differences), "
       "2 ((z_0.975 + z_0.8) sd / delta)^2 + z_0.975^2 / 4 (unpaired, sd pooled), rounded up"}};
}

}  // namespace

json seed_convergence(const SeedSide& a, const SeedSide& b, const std::vector<std::pair<size_t, size_t>>& pairs,
                      const std::vector<double>& levels, int64_t resamples, uint64_t seed) {
  const size_t n = a.tokens.size();
  if (n == 0 || b.tokens != a.tokens) throw Error("seed_convergence: the sides need the same common steps");
  const bool paired = !pairs.empty();
  const std::vector<size_t> checkpoints = quarter_steps(n);
  bool have_valid = true;
  for (const auto* side : {&a, &b}) {
    for (const auto& v : side->final_valid) have_valid = have_valid && v.has_value();
  }
  const Picks all = every_run(a, b, pairs);
  const Statistics point = statistics(a, b, all, checkpoints, levels, have_valid);
  std::vector<Statistics> draws;
  SplitMix64 rng(splitmix64_mix(seed + kSeedResampleStream));
  for (int64_t s = 0; s < resamples; ++s)
    draws.push_back(statistics(a, b, draw_runs(rng, all, pairs), checkpoints, levels, have_valid));

  const auto runs_at = [&](const SeedSide& side, const std::vector<size_t>& pick, size_t j) {
    std::vector<double> v;
    for (size_t r : pick) v.push_back(side.smoothed[r][j]);
    return v;
  };
  const std::vector<double> detect = {0.005, 0.01, 0.02};
  json at = json::array();
  for (size_t c = 0; c < checkpoints.size(); ++c) {
    std::vector<double> resampled;
    for (const auto& d : draws) resampled.push_back(d.at[c]);
    json row = difference_row(point.at[c], resampled, runs_at(a, all.a, checkpoints[c]),
                              runs_at(b, all.b, checkpoints[c]), paired, detect);
    row["tokens"] = a.tokens[checkpoints[c]];
    at.push_back(row);
  }
  json valid = nullptr;
  if (have_valid) {
    std::vector<double> resampled, va, vb;
    for (const auto& d : draws) resampled.push_back(d.valid);
    for (size_t r : all.a) va.push_back(*a.final_valid[r]);
    for (size_t r : all.b) vb.push_back(*b.final_valid[r]);
    valid = difference_row(point.valid, resampled, va, vb, paired, detect);
  }
  json reach = json::array();
  for (size_t l = 0; l < levels.size(); ++l) {
    std::vector<double> resampled;
    for (const auto& d : draws) resampled.push_back(d.ratio[l]);
    json row = percentile_interval(resampled);
    row["loss"] = levels[l];
    row["ratio"] = std::isnan(point.ratio[l]) ? json() : json(point.ratio[l]);
    reach.push_back(row);
  }
  json pair_list = json::array();
  for (const auto& [i, j] : pairs) pair_list.push_back({a.runs[i], b.runs[j]});
  json out = convergence_method(paired, resamples, seed);
  out.update({{"pairs", pair_list},
              {"runs_a", a.smoothed.size()},
              {"runs_b", b.smoothed.size()},
              {"tokens", a.tokens},
              {"loss_at_tokens", at},
              {"final_valid", valid},
              {"tokens_to_reach", reach},
              {"band_a", band(a)},
              {"band_b", band(b)}});
  return out;
}

}  // namespace archspace
