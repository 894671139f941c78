// Downstream evaluation without a model: OLMES metrics from given scores (normalisations, ties, the
// standard error), reading task files (gzip, limit, unconditional requests) and finding task variants.
#include <zlib.h>

#include <cmath>
#include <fstream>
#include <memory>

#include "archspace/eval/downstream.h"
#include "archspace/eval/task_files.h"
#include "archspace/eval/tasks/truthfulqa.h"
#include "test_support.h"

namespace archspace {
namespace {

using testing::expect_error;
using testing::fresh_dir;

TaskRequest request(int64_t doc, int64_t idx, int64_t label, const std::string& continuation) {
  TaskRequest r;
  r.doc_id = doc;
  r.idx = idx;
  r.label = label;
  r.context = "Q:";
  r.continuation = continuation;
  return r;
}

const MetricValue& metric(const TaskResult& r, const std::string& name) {
  for (const auto& m : r.metrics) {
    if (m.name == name) return m;
  }
  throw Error("no metric " + name);
}

// The choice a metric predicts: the gold label for which it scores 1.
int64_t predicted(TaskFiles f, const std::vector<RequestScore>& scores, const std::string& name) {
  for (int64_t label = 0; label < 4; ++label) {
    for (auto& r : f.requests) r.label = label;
    if (metric(task_metrics(f, scores), name).value == 1.0) return label;
  }
  return -1;
}

TEST(DownstreamMetrics, EachNormalisationPicksItsOwnChoice) {
  // Four choices built so that each normalisation prefers another one:
  //   raw:       -1, -3, -3, -4                      -> 0
  //   per token: -1/1, -3/10, -3/5, -4/3             -> 1
  //   per char:  -1/5, -3/4, -3/20, -4/3            -> 2 (code points: " \u00e9\u00e9\u00e9\u00e9" is 5
  //              characters; counted in bytes (9) choice 0 would win with -0.111)
  //   uncond:    -1+0.5, -3+1, -3+1.9, -4+20         -> 3
  TaskFiles f;
  f.task = "t";
  f.format = "rc";
  f.primary_metric = "acc_per_token";
  f.uncond_offset = 100;
  const std::string e = "\xC3\xA9";
  const std::vector<std::string> texts = {" " + e + e + e + e, " aaa", " " + std::string(19, 'b'), " cc"};
  for (int64_t i = 0; i < 4; ++i) f.requests.push_back(request(0, i, 0, texts[i]));
  for (int64_t i = 0; i < 4; ++i) f.requests.push_back(request(100, i, 0, texts[i]));
  const std::vector<RequestScore> scores = {{-1.0, false, 1}, {-3.0, false, 10}, {-3.0, false, 5}, {-4.0, false, 3},
                                            {-0.5, false, 1}, {-1.0, false, 10}, {-1.9, false, 5}, {-20.0, false, 3}};
  EXPECT_EQ(predicted(f, scores, "acc_raw"), 0);
  EXPECT_EQ(predicted(f, scores, "acc_per_token"), 1);
  EXPECT_EQ(predicted(f, scores, "acc_per_char"), 2);
  EXPECT_EQ(predicted(f, scores, "acc_uncond"), 3);
  const TaskResult r = task_metrics(f, scores);
  EXPECT_EQ(r.documents, 1);
  EXPECT_TRUE(metric(r, "acc_per_token").primary);
  EXPECT_FALSE(metric(r, "acc_raw").primary);
  EXPECT_TRUE(std::isnan(metric(r, "acc_raw").stderr_));  // one document: no sample variance
}

TEST(DownstreamMetrics, TiesGoToTheFirstChoiceAndStderrIsTheSampleOne) {
  TaskFiles f;
  f.primary_metric = "acc_raw";
  // Four documents of two choices: gold 0, 1, 0, 1; equal scores everywhere -> choice 0 each time.
  for (int64_t d = 0; d < 4; ++d) {
    for (int64_t i = 0; i < 2; ++i) f.requests.push_back(request(d, i, d % 2, " x"));
  }
  const TaskResult r = task_metrics(f, std::vector<RequestScore>(8, {-1.0, true, 1}));
  const MetricValue& raw = metric(r, "acc_raw");
  EXPECT_EQ(raw.value, 0.5);
  // lm-eval's mean_stderr: sqrt(sum((x - 0.5)^2) / (n - 1) / n) = sqrt(1 / 3 / 4).
  EXPECT_DOUBLE_EQ(raw.stderr_, std::sqrt(1.0 / 3.0 / 4.0));
  EXPECT_EQ(r.metrics.size(), 3u);  // no unconditional requests: no acc_uncond

  f.primary_metric = "acc_uncond";
  expect_error(
      [&] {
        task_metrics(f, std::vector<RequestScore>(8, {-1.0, true, 1}));
      },
      {"primary_metric \"acc_uncond\"", "acc_per_char)"});
}

TEST(DownstreamMetrics, TheLabelNamesTheRequestIdxAsOlmesCompares) {
  // OLMES' MCAccuracy compares the best request's idx with the label (metric.py:265-267), not its position: choices
  // numbered 1..3 with the best at idx 2 and label 2 are right.
  TaskFiles f;
  f.primary_metric = "acc_raw";
  for (int64_t i = 1; i <= 3; ++i) f.requests.push_back(request(0, i, 2, " x"));
  const TaskResult r = task_metrics(f, {{-3.0, false, 1}, {-1.0, false, 1}, {-2.0, false, 1}});
  EXPECT_EQ(metric(r, "acc_raw").value, 1.0);
}

TEST(DownstreamMetrics, TruthfulqaMembershipAndRequestOrderAsOlmes) {
  // OLMES' MC1MC2Accuracy (metric.py:352-378): the requests in idx order, each counted once when its idx is in
  // mc1_indices / mc2_indices, however often or in whatever order they list it.
  TaskFiles f;
  f.primary_metric = "mc2";
  const std::vector<double> ll = {-1.0, -2.0, -0.5, -3.0};
  for (int64_t i = 0; i < 4; ++i) f.requests.push_back(request(0, i, 0, " x"));
  f.document_labels[0] = std::make_shared<MultiTrueLabels>(
      std::vector<int64_t>{1, 0, 1, 0}, std::vector<int64_t>{3, 1, 2}, std::vector<int64_t>{2, 0, 1, 2, 3, 3});
  std::vector<RequestScore> scores;
  for (double x : ll) scores.push_back({x, false, 1});
  const TaskResult r = task_metrics(f, scores);
  const double p_true = std::exp(ll[0]) + std::exp(ll[2]), p_false = std::exp(ll[1]) + std::exp(ll[3]);
  EXPECT_DOUBLE_EQ(metric(r, "mc2").value, p_true / (p_true + p_false));
  EXPECT_EQ(metric(r, "mc1").value, 1.0);  // the best of idx 1, 2, 3 is idx 2, a true one
  // Every exp(ll) underflowing (OLMES raises ZeroDivisionError there): the same quotient from shifted exps.
  for (auto& s : scores) s.loglikelihood -= 2000.0;
  EXPECT_NEAR(metric(task_metrics(f, scores), "mc2").value, p_true / (p_true + p_false), 1e-14);
}

void write_gzip(const std::filesystem::path& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::string line(int64_t doc, int64_t idx, int64_t label, const std::string& context) {
  return nlohmann::json({{"request_type", "loglikelihood"},
                         {"doc_id", doc},
                         {"idx", idx},
                         {"label", label},
                         {"native_id", "n" + std::to_string(doc)},
                         {"request", {{"context", context}, {"continuation", " c" + std::to_string(idx)}}}})
             .dump() +
         "\n";
}

TEST(DownstreamTasks, LoadsTheFirstDocumentsWithTheirUnconditionalRequests) {
  const auto root = fresh_dir("downstream_tasks");
  const auto dir = root / "toy" / "rc_5shot";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"task_config": {"primary_metric": "acc_raw", "metric_kwargs": {"uncond_docid_offset": 1000}}})";
  std::string text;
  for (int64_t d = 0; d < 3; ++d) {
    for (int64_t i = 0; i < 2; ++i) text += line(d, i, 1, "Q" + std::to_string(d));
  }
  for (int64_t d = 0; d < 3; ++d) {
    for (int64_t i = 0; i < 2; ++i) text += line(1000 + d, i, 1, "Answer:");
  }
  write_gzip(dir / "requests.jsonl.gz", text);

  const TaskFiles all = load_task(dir.string(), "toy", "rc", 5);
  EXPECT_EQ(all.documents, 3);
  EXPECT_EQ(all.requests.size(), 12u);
  const TaskFiles two = load_task(dir.string(), "toy", "rc", 5, 2);
  EXPECT_EQ(two.documents, 2);
  ASSERT_EQ(two.requests.size(), 8u);
  EXPECT_EQ(two.requests[4].doc_id, 1000);  // unconditional ones follow, only for the documents kept
  EXPECT_EQ(two.requests[7].doc_id, 1001);
  EXPECT_EQ(two.uncond_offset, 1000);

  // Finding variants: the default shot count, and errors naming what exists.
  const std::vector<std::string> dirs = {root.string()};
  EXPECT_EQ(find_task_variant(dirs, "toy", "rc", std::nullopt), dir.string());
  expect_error([&] { find_task_variant(dirs, "toy", "mc", std::nullopt); }, {"toy: no mc files", "rc_5shot"});
  expect_error([&] { find_task_variant(dirs, "toy", "rc", 0); }, {"no rc_0shot files", "it has: rc_5shot"});
  expect_error([&] { find_task_variant(dirs, "toi", "rc", 5); }, {"unknown task \"toi\"", "tasks: toy"});
  std::vector<std::string> notes;
  const auto both = select_task_variants(dirs, {"toy"}, "both", std::nullopt, &notes);
  ASSERT_EQ(both.size(), 1u);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("skipping toy mc"), std::string::npos);

  // A document missing one of its unconditional requests, a choice numbered twice.
  write_gzip(dir / "requests.jsonl.gz", line(0, 0, 0, "Q") + line(0, 1, 0, "Q") + line(1000, 0, 0, "Answer:"));
  expect_error([&] { load_task(dir.string(), "toy", "rc", 5); },
               {"requests.jsonl.gz", "document 0 has 1 unconditional"});
  write_gzip(dir / "requests.jsonl.gz", line(0, 0, 0, "Q") + line(0, 0, 0, "Q"));
  expect_error([&] { load_task(dir.string(), "toy", "rc", 5); }, {"document 0", "numbered 0..k-1"});
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace archspace
