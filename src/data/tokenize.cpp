#include "archspace/data/tokenize.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "archspace/data/token_source.h"
#include "archspace/tokenizer/tokenizer.h"
#include "archspace/util/error.h"
#include "archspace/util/json_lines.h"
#include "archspace/util/progress.h"

namespace archspace {

namespace fs = std::filesystem;

namespace {

struct Document {
  std::string text;
  std::string where;  // "file" or "file:line", for errors
};

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    if (fs::is_directory(in)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(in)) {
        if (e.is_regular_file()) found.push_back(e.path().string());
      }
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in)) {
      files.push_back(in);
    } else {
      throw Error(in + ": input not found");
    }
  }
  if (files.empty()) throw Error("tokenize: no input files");
  return files;
}

bool is_jsonl(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  return ext == ".jsonl" || ext == ".ndjson";
}

// Streams documents from the inputs in batches of about `batch_bytes`.
class DocumentReader {
 public:
  DocumentReader(std::vector<std::string> files, std::string field)
      : files_(std::move(files)), field_(std::move(field)) {}

  bool next_batch(std::vector<Document>& batch, size_t batch_bytes) {
    batch.clear();
    size_t bytes = 0;
    while (bytes < batch_bytes) {
      if (!in_.is_open()) {
        if (next_file_ == files_.size()) break;
        current_ = files_[next_file_++];
        in_.open(current_, std::ios::binary);
        if (!in_) throw Error(current_ + ": cannot open");
        line_ = 0;
        sources.push_back({current_, fs::file_size(current_), 0});
        if (!is_jsonl(current_)) {
          Document d{std::string((std::istreambuf_iterator<char>(in_)), std::istreambuf_iterator<char>()), current_};
          in_.close();
          bytes_read += d.text.size();
          bytes += d.text.size();
          ++sources.back().documents;
          batch.push_back(std::move(d));
          continue;
        }
      }
      std::string line;
      if (!std::getline(in_, line)) {
        in_.close();
        continue;
      }
      ++line_;
      bytes_read += line.size() + 1;
      const std::string where = current_ + ":" + std::to_string(line_);
      std::optional<nlohmann::json> parsed = parse_json_line(line, where);
      if (!parsed) continue;
      const nlohmann::json& j = *parsed;
      if (!j.is_object() || !j.contains(field_) || !j[field_].is_string()) {
        throw Error(where + ": no string field '" + field_ + "'");
      }
      Document d{j[field_].get<std::string>(), where};
      bytes += d.text.size();
      ++sources.back().documents;
      batch.push_back(std::move(d));
    }
    return !batch.empty();
  }

  uint64_t total_bytes() const {
    uint64_t n = 0;
    for (const auto& f : files_) n += fs::file_size(f);
    return n;
  }

  std::vector<SourceEntry> sources;
  uint64_t bytes_read = 0;

 private:
  std::vector<std::string> files_;
  std::string field_;
  size_t next_file_ = 0;
  std::ifstream in_;
  std::string current_;
  uint64_t line_ = 0;
};

}  // namespace

ShardManifest tokenize_to_shards(const TokenizeOptions& o) {
  auto tokenizer = Tokenizer::load(o.tokenizer);
  auto eos = tokenizer->token_to_id("<|endoftext|>");
  if (!eos) throw Error(tokenizer->path() + ": the tokenizer has no <|endoftext|> token to end documents with");
  const std::vector<std::string> files = expand_inputs(o.inputs);
  const int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());

  DocumentReader reader(files, o.text_field);
  const uint64_t total_bytes = reader.total_bytes();
  const std::unique_ptr<TokenWriter> writer =
      make_token_writer(o.format, o.out_dir, o.shard_tokens, tokenizer->vocab_size());
  std::atomic<uint64_t> replacements{0};
  uint64_t documents = 0, tokens = 0, skipped_empty = 0;
  ProgressLine progress("tokenize", o.progress);
  auto report = [&](bool final) {
    const double mb = reader.bytes_read / 1e6, rate = mb / std::max(progress.elapsed_seconds(), 1e-9);
    const double frac = total_bytes ? double(reader.bytes_read) / total_bytes : 1.0;
    char what[256];
    std::snprintf(what, sizeof(what), "%.1f/%.1f MB (%3.0f%%) | %llu docs | %llu tokens | %.2f MB/s", mb,
                  total_bytes / 1e6, 100 * frac, (unsigned long long)documents, (unsigned long long)tokens, rate);
    progress.update(what, frac, final);
  };

  std::vector<Document> batch;
  std::vector<std::vector<uint32_t>> encoded;
  while (reader.next_batch(batch, 4u << 20)) {
    encoded.assign(batch.size(), {});
    std::atomic<size_t> next{0};
    std::vector<std::exception_ptr> errors(threads);
    auto work = [&](int worker) {
      try {
        for (size_t i; (i = next.fetch_add(1)) < batch.size();) {
          Document& d = batch[i];
          if (auto bad = find_invalid_utf8(d.text)) {
            if (o.invalid_utf8 == InvalidUtf8Policy::kError) {
              throw Error(d.where + ": invalid UTF-8 at byte " + std::to_string(*bad) +
                          " of the document (use --invalid-utf8 replace to substitute U+FFFD)");
            }
            size_t n = 0;
            d.text = utf8_lossy(d.text, &n);
            replacements += n;
          }
          encoded[i] = tokenizer->encode(d.text);
          if (o.verify_roundtrip && tokenizer->decode(encoded[i]) != d.text) {
            throw Error(d.where + ": decode(encode(text)) differs from the text");
          }
        }
      } catch (...) {
        errors[worker] = std::current_exception();
        next = batch.size();  // stop the others early
      }
    };
    std::vector<std::thread> pool;
    for (int w = 1; w < threads; ++w) pool.emplace_back(work, w);
    work(0);
    for (auto& t : pool) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    for (auto& ids : encoded) {
      if (ids.empty()) {
        ++skipped_empty;  // an empty document carries no text to learn from
        continue;
      }
      ids.push_back(*eos);
      writer->add_document(ids);
      ++documents;
      tokens += ids.size();
    }
    if (reader.bytes_read < total_bytes) report(false);  // the last one is forced below
  }
  report(true);
  {
    const double elapsed = progress.elapsed_seconds();
    char done[160];
    std::snprintf(done, sizeof(done), "done: %llu bytes -> %llu tokens in %.3f s (%.2f MB/s, %d threads)",
                  (unsigned long long)reader.bytes_read, (unsigned long long)tokens, elapsed,
                  reader.bytes_read / 1e6 / std::max(elapsed, 1e-9), threads);
    progress.note(done);
  }

  ShardManifest m;
  m.tokenizer_name = tokenizer->name();
  m.tokenizer_sha256 = tokenizer->sha256();
  m.vocab_size = tokenizer->vocab_size();
  m.eos_token_id = *eos;
  m.sources = reader.sources;
  m.invalid_utf8_replacements = replacements;
  // The tokenizer travels with its shards (before the manifest, which marks the directory complete), so
  // that training can hand it on to its checkpoints; readers go by the manifest and ignore the file.
  fs::copy_file(tokenizer->path(), writer->tokenizer_file(), fs::copy_options::overwrite_existing);
  m = writer->finish(m);
  if (skipped_empty) progress.note("skipped " + std::to_string(skipped_empty) + " empty documents");
  return m;
}

}  // namespace archspace
