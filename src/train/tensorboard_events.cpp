#include "archspace/train/tensorboard_events.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "archspace/util/error.h"

namespace archspace {

namespace fs = std::filesystem;

namespace {

const std::array<uint32_t, 256>& crc32c_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // the reflected Castagnoli polynomial
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// TFRecord's mask, so that a CRC of data that contains CRCs stays well distributed.
uint32_t masked_crc(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void put_le(std::string& out, T v) {  // fixed32/fixed64 fields and the framing are little-endian
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(reinterpret_cast<const char*>(bytes), sizeof(T));
}

// A length-delimited field (wire type 2): strings and embedded messages.
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | 2);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event{wall_time = 1 (double), step = 2 (int64)} followed by `what` (one more encoded field).
std::string event(double wall_time, int64_t step, const std::string& what) {
  std::string e;
  e.push_back(static_cast<char>((1 << 3) | 1));
  put_le(e, wall_time);
  e.push_back(static_cast<char>((2 << 3) | 0));
  put_varint(e, static_cast<uint64_t>(step));
  return e + what;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The seconds field of "events.out.tfevents.SECONDS.HOST...", or -1.
long long name_seconds(const std::string& name) {
  static const std::string prefix = "events.out.tfevents.";
  if (name.rfind(prefix, 0) != 0) return -1;
  try {
    return std::stoll(name.substr(prefix.size(), 10));
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto& table = crc32c_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t resumed_at_step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw Error(dir + ": cannot create the TensorBoard directory" +
                (ec ? " (" + ec.message() + ")" : ": not a directory"));
  }
  // Readers take a directory's files in name order, and a resumed run's START must come after the files it
  // supersedes, even when both started within the same second.
  long long seconds = static_cast<long long>(now_seconds());
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    seconds = std::max(seconds, name_seconds(entry.path().filename().string()) + 1);
  }
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  char name[400];
  std::snprintf(name, sizeof(name), "events.out.tfevents.%010lld.%s.%d.archspace", seconds, host, ::getpid());
  path_ = (fs::path(dir) / name).string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw Error(path_ + ": cannot create the TensorBoard event file (" + std::strerror(errno) + ")");
  std::string version;
  put_bytes(version, 3, "brain.Event:2");  // file_version: readers purge by SessionLog only from version 2 on
  record(event(now_seconds(), 0, version));
  if (resumed_at_step > 0) {
    const std::string start = {static_cast<char>((1 << 3) | 0), 1};  // SessionLog{status: START}
    std::string field;
    put_bytes(field, 7, start);
    record(event(now_seconds(), resumed_at_step, field));
  }
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::scalar(const std::string& tag, float value, int64_t step, double wall_time) {
  std::string v;
  put_bytes(v, 1, tag);
  v.push_back(static_cast<char>((2 << 3) | 5));  // simple_value, a fixed32 float
  put_le(v, value);
  std::string summary, field;
  put_bytes(summary, 1, v);
  put_bytes(field, 5, summary);
  record(event(wall_time, step, field));
}

void TensorBoardWriter::record(const std::string& data) {
  std::string framed;
  put_le(framed, static_cast<uint64_t>(data.size()));
  const uint32_t length_crc = masked_crc(framed.data(), 8);
  put_le(framed, length_crc);
  framed += data;
  put_le(framed, masked_crc(data.data(), data.size()));
  if (std::fwrite(framed.data(), 1, framed.size(), file_) != framed.size())
    throw Error(path_ + ": write failed (" + std::strerror(errno) + ")");
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0 || std::ferror(file_))
    throw Error(path_ + ": write failed (" + std::strerror(errno) + ")");
}

}  // namespace archspace
