#pragma once
// A small streaming JSON writer for the machine-readable outputs (--json, metrics files).

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace kiln {

class JsonWriter {
 public:
  void begin_object() { open('{'); }
  void end_object() { close('}'); }
  void begin_array() { open('['); }
  void end_array() { close(']'); }
  void key(const std::string& k) {
    separate();
    out_ += quote(k) + ":";
    after_key_ = true;
  }
  void value(const std::string& v) { scalar(quote(v)); }
  void value(const char* v) { scalar(quote(v)); }
  void value(bool v) { scalar(v ? "true" : "false"); }
  void value(int v) { scalar(std::to_string(v)); }
  void value(long v) { scalar(std::to_string(v)); }
  void value(long long v) { scalar(std::to_string(v)); }
  void value(unsigned long v) { scalar(std::to_string(v)); }
  void value(unsigned long long v) { scalar(std::to_string(v)); }
  void value(double v) {
    if (!std::isfinite(v)) {
      scalar("null");
      return;
    }
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%.10g", v);
    scalar(buf);
  }
  // A number with a fixed count of decimals: unix times, which "%.10g" would cut to seconds.
  void fixed_field(const std::string& k, double v, int decimals) {
    key(k);
    if (!std::isfinite(v)) {
      scalar("null");
      return;
    }
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
    scalar(buf);
  }
  template <typename T>
  void field(const std::string& k, const T& v) {
    key(k);
    value(v);
  }
  const std::string& str() const { return out_; }

  static std::string quote(const std::string& s) {
    std::string r = "\"";
    for (char c : s) {
      switch (c) {
        case '"':
          r += "\\\"";
          break;
        case '\\':
          r += "\\\\";
          break;
        case '\n':
          r += "\\n";
          break;
        case '\t':
          r += "\\t";
          break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            r += buf;
          } else {
            r += c;
          }
      }
    }
    return r + "\"";
  }

 private:
  void separate() {
    if (after_key_) return;
    if (!first_.empty() && !first_.back()) out_ += ",";
    if (!first_.empty()) first_.back() = false;
  }
  void scalar(const std::string& text) {
    separate();
    out_ += text;
    after_key_ = false;
  }
  void open(char c) {
    separate();
    out_ += c;
    after_key_ = false;
    first_.push_back(true);
  }
  void close(char c) {
    out_ += c;
    first_.pop_back();
  }
  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace kiln
