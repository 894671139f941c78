// TensorBoard event files written natively, so that training needs no Python for them: TFRecord framing
// (uint64 length, masked CRC-32C of the length, the data, masked CRC-32C of the data) of Event protos
// (tensorboard/compat/proto/event.proto: wall_time 1, step 2, file_version 3, summary 5, session_log 7;
// summary.proto: Summary.value 1, Value.tag 1, Value.simple_value 2; SessionLog.status 1, START = 1),
// the few fields hand-encoded.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace archspace {

class TensorBoardWriter {
 public:
  // Creates `dir` and a new events.out.tfevents.* file in it, named to sort after the files already there
  // (TensorBoard reads a directory's files in name order). `resumed_at_step` > 0: a resumed run, whose first
  // event is a SessionLog START at that step, so that TensorBoard's readers drop what a killed run wrote from
  // that step on. Throws naming the path.
  TensorBoardWriter(const std::string& dir, int64_t resumed_at_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void scalar(const std::string& tag, float value, int64_t step, double wall_time);
  void flush();  // throws naming the file when the data did not reach it (disk full)
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

// CRC-32C (Castagnoli), which the framing checks.
uint32_t crc32c(const void* data, size_t size);

}  // namespace archspace
