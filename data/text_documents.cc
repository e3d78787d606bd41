#include "data/text_documents.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "core/check.h"
#include "core/file_kind.h"
#include "core/json_value.h"
#include "data/file_io.h"
#include "data/unicode_text.h"

namespace kiln::data {
namespace {

constexpr std::size_t kChunkBytes = std::size_t{1} << 20;

bool ends_with(const std::string& s, const char* suffix) {
  const std::size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

bool is_blank(const char* begin, const char* end) {
  return std::all_of(begin, end, [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

std::string location(const std::string& path, std::int64_t line) {
  return path + ":" + std::to_string(line);
}

}  // namespace

std::vector<TextFile> expand_text_inputs(const std::vector<std::string>& patterns) {
  if (patterns.empty()) throw InputError("no input: give one or more files or globs of text");
  std::vector<TextFile> files;
  std::set<std::string> seen;
  for (const std::string& pattern : patterns) {
    const std::vector<std::string> paths = glob_paths(pattern);
    if (paths.empty()) {
      throw InputError(pattern + ": matches no file (give .txt, .jsonl, .txt.gz or .jsonl.gz " +
                       "files, or a glob of them in quotes: 'corpus/*.jsonl.gz')");
    }
    for (const std::string& path : paths) {
      if (!seen.insert(path).second) continue;
      TextFile f{path, false, false};
      if (ends_with(path, ".txt.gz") || ends_with(path, ".jsonl.gz")) f.gzip = true;
      const std::string stem = f.gzip ? path.substr(0, path.size() - 3) : path;
      if (ends_with(stem, ".jsonl")) {
        f.json_lines = true;
      } else if (!ends_with(stem, ".txt")) {
        throw InputError(path + " (matched by " + pattern +
                         "): not a corpus file: kiln tokenize reads .txt (a document per file), "
                         ".jsonl (a document per line) and the same gzip-compressed (.txt.gz, "
                         ".jsonl.gz)");
      }
      require_regular_file(path, "an input file");
      files.push_back(std::move(f));
    }
  }
  return files;
}

// A file's bytes in chunks, decompressed on the way for gzip. InputError carrying only what went
// wrong; the reader adds the file and line.
class TextDocumentReader::Stream {
 public:
  Stream(const std::string& path, bool gzip) : gzip_(gzip) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw InputError(std::string("cannot open: ") + std::strerror(errno));
    if (gzip_) {
      in_.resize(kChunkBytes);
      // 15 + 32: a zlib or gzip header, detected.
      if (inflateInit2(&z_, 15 + 32) != Z_OK) {
        KILN_IGNORE_ERROR(::close(fd_));
        throw InputError("zlib could not start inflating (out of memory?)");
      }
    }
  }
  ~Stream() {
    if (gzip_) inflateEnd(&z_);
    KILN_IGNORE_ERROR(::close(fd_));  // read-only: a failed close loses nothing
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Up to `capacity` bytes into `out`; 0 at the end.
  std::size_t read(char* out, std::size_t capacity) {
    return gzip_ ? inflate_some(out, capacity) : read_raw(out, capacity);
  }

 private:
  std::size_t read_raw(char* out, std::size_t capacity) {
    for (;;) {
      const ssize_t n = ::read(fd_, out, capacity);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw InputError(std::string("read failed: ") + std::strerror(errno));
      compressed_ += static_cast<std::uint64_t>(n);
      return static_cast<std::size_t>(n);
    }
  }

  void fill() {
    const std::size_t n = read_raw(reinterpret_cast<char*>(in_.data()), in_.size());
    if (n == 0) eof_ = true;
    z_.next_in = in_.data();
    z_.avail_in = static_cast<uInt>(n);
  }

  std::size_t inflate_some(char* out, std::size_t capacity) {
    for (;;) {
      if (member_done_) {
        // After a member: the end of the file, or another member (gzip -c a b > ab.gz).
        if (z_.avail_in == 0 && !eof_) fill();
        if (z_.avail_in == 0) return 0;
        inflateReset(&z_);
        member_done_ = false;
      }
      if (z_.avail_in == 0 && !eof_) fill();
      z_.next_out = reinterpret_cast<Bytef*>(out);
      z_.avail_out = static_cast<uInt>(std::min<std::size_t>(capacity, 1u << 30));
      const uInt offered = z_.avail_out;
      const int status = inflate(&z_, Z_NO_FLUSH);
      const std::size_t produced = offered - z_.avail_out;
      if (status == Z_STREAM_END) {
        member_done_ = true;
      } else if (status != Z_OK && status != Z_BUF_ERROR) {
        throw InputError(std::string("corrupt gzip stream: ") +
                         (z_.msg != nullptr ? z_.msg : zError(status)) + " (at compressed byte " +
                         std::to_string(compressed_ - z_.avail_in) + ")");
      } else if (produced == 0 && eof_ && z_.avail_in == 0) {
        throw InputError("truncated gzip stream: the file ends inside a compressed member (at " +
                         std::string("compressed byte ") + std::to_string(compressed_) + ")");
      }
      if (produced > 0) return produced;
    }
  }

  bool gzip_;
  int fd_ = -1;
  z_stream z_{};
  std::vector<Bytef> in_;
  bool eof_ = false, member_done_ = false;
  std::uint64_t compressed_ = 0;  // bytes read from the file
};

TextDocumentReader::TextDocumentReader(std::vector<TextFile> files) : files_(std::move(files)) {}

TextDocumentReader::~TextDocumentReader() = default;

bool TextDocumentReader::read_more() {
  const std::size_t used = pending_.size();
  pending_.resize(used + kChunkBytes);
  const std::size_t got = stream_->read(&pending_[used], kChunkBytes);
  pending_.resize(used + got);
  bytes_read_ += got;
  return got > 0;
}

bool TextDocumentReader::next(RawDocument* doc) {
  for (;;) {
    if (!stream_) {
      if (next_file_ == files_.size()) return false;
      file_ = next_file_++;
      pending_.clear();
      pending_begin_ = 0;
      line_ = 1;
      try {
        stream_ = std::make_unique<Stream>(files_[file_].path, files_[file_].gzip);
      } catch (const InputError& e) {
        *doc = RawDocument{file_, 1, {}, files_[file_].path + ": " + e.what()};
        return true;
      }
    }
    const TextFile& f = files_[file_];
    // Where a read failed: the line the bytes read so far end on.
    const auto failed = [&](const InputError& e) {
      std::int64_t line = line_;
      line += std::count(pending_.begin() + static_cast<std::ptrdiff_t>(pending_begin_),
                         pending_.end(), '\n');
      *doc = RawDocument{file_, line, {}, location(f.path, line) + ": " + e.what()};
      stream_.reset();
      pending_.clear();
      return true;
    };
    if (!f.json_lines) {
      try {
        while (read_more()) {
        }
      } catch (const InputError& e) {
        return failed(e);
      }
      *doc = RawDocument{file_, 1, std::move(pending_), {}};
      pending_.clear();
      stream_.reset();
      return true;
    }
    for (;;) {
      const std::size_t newline = pending_.find('\n', pending_begin_);
      const bool at_end = newline == std::string::npos;
      if (at_end) {
        // Keep the unfinished line, read on.
        pending_.erase(0, pending_begin_);
        pending_begin_ = 0;
        bool more;
        try {
          more = read_more();
        } catch (const InputError& e) {
          return failed(e);
        }
        if (more) continue;
        stream_.reset();
        if (pending_.empty() || is_blank(pending_.data(), pending_.data() + pending_.size())) {
          pending_.clear();
          break;  // the next file
        }
        // A last line without a line break.
        *doc = RawDocument{file_, line_, std::move(pending_), {}};
        pending_.clear();
        return true;
      }
      const char* begin = pending_.data() + pending_begin_;
      std::size_t length = newline - pending_begin_;
      pending_begin_ = newline + 1;
      const std::int64_t line = line_++;
      if (is_blank(begin, begin + length)) continue;
      if (begin[length - 1] == '\r') --length;  // CRLF
      *doc = RawDocument{file_, line, std::string(begin, length), {}};
      return true;
    }
  }
}

namespace {

// Throws InputError "FILE:LINE:COLUMN..." for the first byte of `doc` that is not UTF-8.
void check_utf8(const RawDocument& doc, const TextFile& file) {
  const std::size_t bad = find_invalid_utf8(doc.bytes);
  if (bad == doc.bytes.size()) return;
  // The line and column (in bytes, from 1) of the first bad byte.
  std::int64_t line = doc.line;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < bad; ++i) {
    if (doc.bytes[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  char byte[8];
  std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<unsigned char>(doc.bytes[bad]));
  throw InputError(location(file.path, line) + ": invalid UTF-8: byte " + byte + " at column " +
                   std::to_string(bad - line_start + 1) +
                   " does not start or continue a well-formed character");
}

}  // namespace

JsonValue document_object(RawDocument&& doc, const TextFile& file, const std::string& expected) {
  check_utf8(doc, file);
  const std::string where = location(file.path, doc.line);
  JsonValue value = parse_json(doc.bytes, [&](std::size_t at, const std::string& what) {
    throw InputError(where + ": not a JSON line: " + what + " (at column " +
                     std::to_string(at + 1) + ")");
  });
  if (value.kind != JsonValue::Kind::Object) {
    throw InputError(where + ": expected a JSON object with " + expected + ", found " +
                     json_kind_name(value.kind));
  }
  return value;
}

std::size_t document_field(const JsonValue& object, const std::string& where,
                           const std::string& field, const std::string& hint) {
  const auto name = std::find(object.names.begin(), object.names.end(), field);
  if (name != object.names.end()) return static_cast<std::size_t>(name - object.names.begin());
  std::string names;
  for (std::size_t i = 0; i < object.names.size() && i < 8; ++i) {
    names += (i ? ", " : "") + object.names[i];
  }
  throw InputError(where + ": no field '" + field + "' (the object has " +
                   (names.empty() ? std::string("no fields") : names) + "; " + hint + ")");
}

std::string document_text(RawDocument&& doc, const TextFile& file, const std::string& field) {
  if (!file.json_lines) {
    check_utf8(doc, file);
    return std::move(doc.bytes);
  }
  const std::string where = location(file.path, doc.line);
  JsonValue value = document_object(std::move(doc), file, "a string field '" + field + "'");
  JsonValue& text =
      value.items[document_field(value, where, field, "--field names the one holding the text")];
  if (text.kind != JsonValue::Kind::String) {
    throw InputError(where + ": field '" + field + "' is " + json_kind_name(text.kind) +
                     ", not a string");
  }
  return std::move(text.string);
}

}  // namespace kiln::data
