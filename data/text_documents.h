#pragma once
// The documents of a text corpus, as kiln tokenize reads them (docs/data.md, "kiln tokenize"):
//
//   .txt   one document: the whole file (as llm.c's tinyshakespeare.py and tinystories.py
//          treat a file of text)
//   .jsonl one document per line: the line is a JSON object, the document its string field
//          (`text` by default); blank lines are skipped
//   .txt.gz, .jsonl.gz   the same, gzip-compressed (several members concatenated are one stream)
//
// Reading is split in two so that the expensive half runs on worker threads: the reader (one
// thread, in order) cuts the input into raw documents, a file or a line, noting where each
// starts; document_text() (any thread) parses a JSON line and checks UTF-8. Every problem is a
// message naming the file and the line: "corpus/a.jsonl.gz:17: no field 'text'".

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/json_value.h"

namespace kiln::data {

struct TextFile {
  std::string path;
  bool json_lines = false;  // .jsonl[.gz], else .txt[.gz]
  bool gzip = false;
};

// The files that `patterns` (glob(3) patterns or plain paths) match: each pattern's files sorted
// bytewise, the patterns in the order given, a file matched twice read once. InputError naming
// the pattern when it matches nothing, and naming the file when its name does not end in .txt,
// .jsonl, .txt.gz or .jsonl.gz or it is not a regular file.
std::vector<TextFile> expand_text_inputs(const std::vector<std::string>& patterns);

// One unit of input, in the input's order.
struct RawDocument {
  std::size_t file = 0;   // index into the reader's files
  std::int64_t line = 1;  // where it starts, from 1
  std::string bytes;      // the file's text, or one line of JSON without its line break
  std::string error;      // not empty: the input could not be read here (message names
                          // file:line); the rest of that file is not read
};

class TextDocumentReader {
 public:
  explicit TextDocumentReader(std::vector<TextFile> files);
  ~TextDocumentReader();
  TextDocumentReader(const TextDocumentReader&) = delete;
  TextDocumentReader& operator=(const TextDocumentReader&) = delete;

  // The next raw document; false after the last. A file that cannot be opened or read, a corrupt
  // or truncated gzip stream: a RawDocument whose `error` says so, then the next file.
  bool next(RawDocument* doc);

  const std::vector<TextFile>& files() const { return files_; }
  std::uint64_t bytes_read() const { return bytes_read_; }  // decompressed

 private:
  class Stream;
  bool read_more();  // appends the next chunk of the open file to pending_; false at its end

  std::vector<TextFile> files_;
  std::size_t next_file_ = 0;
  std::unique_ptr<Stream> stream_;  // the open file, or nullptr
  std::size_t file_ = 0;            // its index
  std::string pending_;             // read, not yet handed out
  std::size_t pending_begin_ = 0;
  std::int64_t line_ = 1;  // the line pending_[pending_begin_] is on
  std::uint64_t bytes_read_ = 0;
};

// The document's text (taking the raw document's bytes): a .txt document's bytes, or a JSON line's
// `field`. Throws InputError
// "FILE:LINE: ..." for a line that is not a JSON object, one without the field or whose field is
// not a string, and for text that is not UTF-8 (naming the line and byte column of the first bad
// byte).
std::string document_text(RawDocument&& doc, const TextFile& file, const std::string& field);

// A .jsonl line's object (taking the raw document's bytes). Throws InputError "FILE:LINE: ..."
// for text that is not UTF-8, a line that is not JSON, or a value that is not an object
// (`expected` says what the object should hold: "a string field 'text'").
JsonValue document_object(RawDocument&& doc, const TextFile& file, const std::string& expected);

// Where the member `field` of a line's object is in its `items`. InputError "WHERE: no field 'F'
// (the object has a, b; HINT)" when it has none.
std::size_t document_field(const JsonValue& object, const std::string& where,
                           const std::string& field, const std::string& hint);

}  // namespace kiln::data
