// util/gzip_lines: lines streamed out of gzip (and plain) files, stopping early, and every way a file can be bad
// (a long line, a gzip bomb, a cut or damaged stream) as an error naming the file, without reading it whole.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "archspace/util/error.h"
#include "archspace/util/gzip_lines.h"

using namespace archspace;
namespace fs = std::filesystem;

namespace {

class GzipLines : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("archspace-gzip-lines-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string gzip_file(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    for (size_t at = 0; at < text.size(); at += 1 << 20) {  // gzwrite takes an unsigned length
      const unsigned n = static_cast<unsigned>(std::min<size_t>(1 << 20, text.size() - at));
      EXPECT_EQ(gzwrite(f, text.data() + at, n), static_cast<int>(n));
    }
    EXPECT_EQ(gzclose(f), Z_OK);
    return path;
  }
  std::string plain_file(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  static std::string bytes_of(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  static std::vector<std::pair<int64_t, std::string>> lines_of(const std::string& path, GzipLineLimits limits = {},
                                                               int64_t stop_after = 0) {
    std::vector<std::pair<int64_t, std::string>> out;
    for_each_gzip_line(path, limits, [&](const std::string& line, int64_t n) {
      out.emplace_back(n, line);
      return stop_after == 0 || n < stop_after;
    });
    return out;
  }
  static std::string error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  }

  fs::path dir_;
};

const std::vector<std::pair<int64_t, std::string>> kLines = {{1, "a"}, {2, "b"}, {3, ""}, {4, "last"}};

TEST_F(GzipLines, GzipAndPlainFilesGiveTheSameNumberedLines) {
  const std::string text = "a\nb\r\n\nlast";  // CRLF, an empty line, no newline at the end
  EXPECT_EQ(lines_of(gzip_file("t.gz", text)), kLines);
  EXPECT_EQ(lines_of(plain_file("t.txt", text)), kLines);
  EXPECT_EQ(lines_of(gzip_file("nl.gz", text + "\n")), kLines);  // a final newline adds no empty line
  EXPECT_TRUE(lines_of(gzip_file("empty.gz", "")).empty());
  // Lines across the reader's 64 KiB chunks arrive whole.
  const std::string long_line(200000, 'x');
  const auto across = lines_of(gzip_file("long.gz", "y\n" + long_line + "\nz\n"));
  ASSERT_EQ(across.size(), 3u);
  EXPECT_EQ(across[1].second, long_line);
  EXPECT_EQ(across[2], (std::pair<int64_t, std::string>{3, "z"}));
}

TEST_F(GzipLines, StopsWhenTheCallbackSaysSo) {
  const std::string path = gzip_file("t.gz", "a\nb\n\nlast\n");
  const auto two = lines_of(path, {}, 2);
  EXPECT_EQ(two, (std::vector<std::pair<int64_t, std::string>>{{1, "a"}, {2, "b"}}));
  int64_t seen = 0;
  EXPECT_EQ(for_each_gzip_line(path, {}, [&](const std::string&, int64_t) { return ++seen < 3; }), 3);
  EXPECT_EQ(seen, 3);
}

TEST_F(GzipLines, ALineOverTheLimitIsAnErrorNamingFileAndLine) {
  const std::string path = gzip_file("t.gz", "0123456789\n01234567890\n");
  const std::string err = error_of([&] { lines_of(path, GzipLineLimits{10, UINT64_MAX}); });
  EXPECT_EQ(err, path + ":2: line longer than 10 bytes");
  EXPECT_EQ(lines_of(path, GzipLineLimits{11, UINT64_MAX}).size(), 2u);  // at the limit: read
}

TEST_F(GzipLines, AGzipBombStopsAtTheTotalLimitWithoutBeingInflated) {
  // 64 MiB of short lines in about 64 KiB of gzip: stopped at 1 MiB, long before the rest is inflated.
  std::string chunk;
  for (int i = 0; i < 1 << 16; ++i) chunk += "{}\n";
  const std::string path = (dir_ / "bomb.gz").string();
  gzFile f = gzopen(path.c_str(), "wb9");
  for (int i = 0; i < 64 * (1 << 20) / static_cast<int>(chunk.size()); ++i)
    gzwrite(f, chunk.data(), static_cast<unsigned>(chunk.size()));
  gzclose(f);
  int64_t lines = 0;
  const std::string err = error_of([&] {
    for_each_gzip_line(path, GzipLineLimits{64, uint64_t{1} << 20}, [&](const std::string&, int64_t) {
      ++lines;
      return true;
    });
  });
  EXPECT_EQ(err, path + ": decompresses to more than 1 MiB (the limit for this kind of file)");
  EXPECT_LE(lines, (1 << 20) / 3);  // only lines within the first MiB were handed on
}

TEST_F(GzipLines, ACutOrDamagedStreamIsAnErrorAndItsCutLineIsNotHandedOn) {
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "{\"doc_id\": " + std::to_string(i) + "}\n";
  const std::string whole = bytes_of(gzip_file("whole.gz", text));
  const std::string cut = plain_file("cut.gz", whole.substr(0, whole.size() / 2));
  std::vector<std::string> seen;
  const std::string err = error_of([&] {
    for_each_gzip_line(cut, {}, [&](const std::string& line, int64_t) {
      seen.push_back(line);
      return true;
    });
  });
  EXPECT_EQ(err, cut + ": corrupt gzip file (truncated stream)");
  ASSERT_FALSE(seen.empty());
  for (const std::string& line : seen) EXPECT_EQ(line.back(), '}');  // whole lines only
  std::string damaged = whole;
  for (size_t i = 100; i < 140; ++i) damaged[i] = static_cast<char>(damaged[i] ^ 0x5a);
  const std::string bad = plain_file("damaged.gz", damaged);
  EXPECT_EQ(error_of([&] { lines_of(bad); }).rfind(bad + ": corrupt gzip file (", 0), 0u);
  EXPECT_EQ(error_of([&] { lines_of((dir_ / "missing.gz").string()); }).rfind((dir_ / "missing.gz").string() + ":", 0),
            0u);
}

}  // namespace
