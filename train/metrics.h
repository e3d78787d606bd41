#pragma once
// Where training reports go: a JSONL file of records, TensorBoard event files with the same
// scalars, and a progress bar on a terminal. Only rank 0 writes them.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kiln::train {

using Record = std::vector<std::pair<std::string, double>>;

// Appends one JSON object per line; flushed after each record so a killed run keeps its log.
class JsonlWriter {
 public:
  explicit JsonlWriter(const std::string& path, bool append);
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  void write(const Record& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// TensorBoard's event-file format: TFRecords (length, masked CRC-32C, payload, masked CRC-32C)
// holding serialized tensorflow.Event messages with scalar summaries, encoded by hand so that
// TensorBoard's own reader loads them without TensorFlow here.
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  void scalar(const std::string& tag, double value, std::int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);
  std::string path_;
  std::FILE* file_ = nullptr;
};

std::uint32_t crc32c(const void* data, std::size_t size);

// A one-line progress bar with ETA, redrawn in place; only used when stdout is a terminal.
class ProgressBar {
 public:
  ProgressBar(std::int64_t total, bool enabled);
  void update(std::int64_t done, const std::string& suffix);
  void finish();
  bool enabled() const { return enabled_; }

 private:
  std::int64_t total_;
  bool enabled_;
  std::chrono::steady_clock::time_point start_;
  std::int64_t start_done_ = -1;
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"

}  // namespace kiln::train
