#include "train/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>

#include "core/check.h"
#include "core/json_writer.h"

namespace kiln::train {
namespace {

// O_NOFOLLOW: metrics.jsonl and the event file are written in place, so a symbolic link planted
// at their name would make Kiln overwrite (or append to) whatever file it points to.
std::FILE* open_or_throw(const std::string& path, bool append) {
  const int fd =
      ::open(path.c_str(),
             O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd < 0 && errno == ELOOP) {
    throw InputError(path +
                     " is a symbolic link; Kiln does not write logs through links: remove "
                     "it or choose another logging.dir");
  }
  std::FILE* f = fd < 0 ? nullptr : ::fdopen(fd, append ? "a" : "w");
  if (f == nullptr) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    throw Error("cannot open " + path + " for writing: " + std::strerror(error) +
                " (check logging.dir)");
  }
  return f;
}

// Protobuf wire format, just what tensorflow.Event needs.
void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void put_tag(std::string& out, int field, int wire) {
  put_varint(out, (field << 3) | wire);
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}
void put_fixed64(std::string& out, int field, double v) {
  put_tag(out, field, 1);
  char b[8];
  std::memcpy(b, &v, 8);
  out.append(b, 8);
}
void put_fixed32(std::string& out, int field, float v) {
  put_tag(out, field, 5);
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::uint32_t masked_crc(const std::string& s) {
  std::uint32_t crc = crc32c(s.data(), s.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t size) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t crc = 0xffffffffu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

LogFile::LogFile(const std::string& path, bool append)
    : path_(path), file_(open_or_throw(path, append)) {
  struct stat info {};
  if (::fstat(::fileno(file_), &info) == 0) complete_bytes_ = info.st_size;
}

LogFile::~LogFile() {
  close();
}

void LogFile::fail(int error, const char* what) {
  failure_ = "cannot " + std::string(what) + " " + path_ + ": " + std::strerror(error) +
             (error == ENOSPC ? " (the disk under logging.dir is full)" : "");
  // Back to the last complete record: a reader never meets half a line or half an event.
  if (::ftruncate(::fileno(file_), complete_bytes_) != 0) {
    failure_ += std::string("; cutting it back to its last complete record failed too: ") +
                std::strerror(errno);
  }
  std::fprintf(stderr,
               "kiln: warning: %s; nothing more is written to it. The run goes on; kiln train "
               "exits with code %d at its end\n",
               failure_.c_str(), kExitLogWriteFailed);
  std::fflush(stderr);
}

bool LogFile::write(const void* bytes, std::size_t size) {
  if (file_ == nullptr || !failure_.empty()) return false;
  errno = 0;
  if (std::fwrite(bytes, 1, size, file_) != size) {
    fail(errno != 0 ? errno : EIO, "write");
    return false;
  }
  return true;
}

void LogFile::flush() {
  if (file_ == nullptr || !failure_.empty()) return;
  errno = 0;
  if (std::fflush(file_) != 0) {
    fail(errno != 0 ? errno : EIO, "write");
    return;
  }
  struct stat info {};
  if (::fstat(::fileno(file_), &info) == 0) complete_bytes_ = info.st_size;
}

void LogFile::close() {
  if (file_ == nullptr) return;
  flush();
  // fsync: a full disk can surface only when the data reaches it (NFS, some file systems).
  if (failure_.empty() && ::fsync(::fileno(file_)) != 0 && errno != EINVAL && errno != EROFS) {
    fail(errno, "write");
  }
  std::FILE* f = file_;
  file_ = nullptr;
  if (std::fclose(f) != 0 && failure_.empty()) {
    failure_ = "cannot close " + path_ + ": " + std::strerror(errno);
    std::fprintf(stderr, "kiln: warning: %s\n", failure_.c_str());
  }
}

JsonlWriter::JsonlWriter(const std::string& path, bool append) : file_(path, append) {}

void JsonlWriter::write(const Record& record) {
  JsonWriter j;
  j.begin_object();
  for (const auto& [key, value] : record) {
    if (key == "step" || key == "epoch") {
      j.field(key, static_cast<long long>(value));
    } else if (key == "time") {
      j.fixed_field(key, value, 3);  // unix seconds to the millisecond
    } else {
      j.field(key, value);
    }
  }
  j.end_object();
  const std::string line = j.str() + "\n";
  file_.write(line.data(), line.size());
  file_.flush();
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  char host[128] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string path = dir + "/events.out.tfevents." +
                           std::to_string(static_cast<long long>(wall_time())) + "." + host + "." +
                           std::to_string(::getpid());
  file_ = std::make_unique<LogFile>(path, false);
  std::string event;
  put_fixed64(event, 1, wall_time());
  put_bytes(event, 3, "brain.Event:2");
  write_record(event);
  flush();
}

void TensorBoardWriter::write_record(const std::string& payload) {
  std::string record;
  std::uint64_t n = payload.size();
  for (int i = 0; i < 8; ++i) record += static_cast<char>((n >> (8 * i)) & 0xff);
  const std::uint32_t hcrc = masked_crc(record), pcrc = masked_crc(payload);
  record.append(reinterpret_cast<const char*>(&hcrc), 4);
  record += payload;
  record.append(reinterpret_cast<const char*>(&pcrc), 4);
  file_->write(record.data(), record.size());
}

void TensorBoardWriter::scalar(const std::string& tag, double value, std::int64_t step) {
  std::string v;
  put_bytes(v, 1, tag);
  put_fixed32(v, 2, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 1, v);
  std::string event;
  put_fixed64(event, 1, wall_time());
  put_tag(event, 2, 0);
  put_varint(event, static_cast<std::uint64_t>(step));
  put_bytes(event, 5, summary);
  write_record(event);
}

void TensorBoardWriter::flush() {
  file_->flush();
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%lds", s);
  }
  return buf;
}

ProgressBar::ProgressBar(std::int64_t total, bool enabled)
    : total_(total), enabled_(enabled), start_(std::chrono::steady_clock::now()) {}

void ProgressBar::update(std::int64_t done, const std::string& suffix) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (start_done_ < 0) {
    start_done_ = done;
    start_ = now;
  }
  double elapsed = std::chrono::duration<double>(now - start_).count();
  double rate = done > start_done_ ? (done - start_done_) / elapsed : 0;
  double eta = rate > 0 ? (total_ - done) / rate : -1;
  int width = 30;
  int filled = total_ > 0 ? static_cast<int>(width * static_cast<double>(done) / total_) : 0;
  std::string bar(filled, '#');
  bar += std::string(width - filled, '.');
  std::printf("\r[%s] %lld/%lld %s ETA %s %s\033[K", bar.c_str(), static_cast<long long>(done),
              static_cast<long long>(total_), format_duration(elapsed).c_str(),
              format_duration(eta).c_str(), suffix.c_str());
  std::fflush(stdout);
}

void ProgressBar::finish() {
  if (!enabled_) return;
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace kiln::train
