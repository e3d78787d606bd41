#pragma once
// Where training reports go: a JSONL file of records, TensorBoard event files with the same
// scalars, and a progress bar on a terminal. Only rank 0 writes them.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kiln::train {

using Record = std::vector<std::pair<std::string, double>>;

// `kiln train`'s exit code when the run finished (checkpoints included) but a log could not be
// written whole (a full disk under logging.dir): sysexits.h's EX_IOERR.
constexpr int kExitLogWriteFailed = 74;

// A log file written in place, every write and flush checked. The first failure (a full disk,
// an I/O error) is reported once on stderr naming the file and errno's text, the file is cut back
// to its last complete record (never left ending in half a line), and nothing more is written to
// it: failure() says what went wrong, for the run's exit code.
class LogFile {
 public:
  LogFile(const std::string& path, bool append);
  ~LogFile();
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;
  // Buffers `bytes`; false once the file has failed.
  bool write(const void* bytes, std::size_t size);
  // Pushes what is buffered to the file: the end of a complete record.
  void flush();
  // Flushes and closes (the destructor does it too, reporting rather than throwing).
  void close();
  const std::string& path() const { return path_; }
  const std::string& failure() const { return failure_; }  // "" while every write succeeded

 private:
  void fail(int error, const char* what);
  std::string path_;
  std::FILE* file_ = nullptr;
  long long complete_bytes_ = 0;  // the file's size after the last record flushed whole
  std::string failure_;
};

// Appends one JSON object per line; flushed after each record so a killed run keeps its log.
class JsonlWriter {
 public:
  explicit JsonlWriter(const std::string& path, bool append);
  void write(const Record& record);
  const std::string& path() const { return file_.path(); }
  LogFile& file() { return file_; }

 private:
  LogFile file_;
};

// TensorBoard's event-file format: TFRecords (length, masked CRC-32C, payload, masked CRC-32C)
// holding serialized tensorflow.Event messages with scalar summaries, encoded by hand so that
// TensorBoard's own reader loads them without TensorFlow here.
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& dir);
  void scalar(const std::string& tag, double value, std::int64_t step);
  void flush();
  const std::string& path() const { return file_->path(); }
  LogFile& file() { return *file_; }

 private:
  void write_record(const std::string& payload);
  std::unique_ptr<LogFile> file_;
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
