#include "data/unicode_text.h"

#include <algorithm>
#include <cstring>

#include "core/json_string.h"

namespace kiln::data {
namespace {

struct CodePointRange {
  std::uint32_t first, last;
};
struct CombiningClassRange {
  std::uint32_t first, last, ccc;
};
struct Decomposition {
  std::uint32_t cp;
  std::uint32_t to[4];  // 0-padded
};
struct Composition {
  std::uint32_t first, second, composite;
};
#include "data/unicode_nfc.inc"
#include "data/unicode_ranges.inc"

// The range of `ranges` (sorted, disjoint) holding cp, or nullptr.
template <typename Range, std::size_t N>
const Range* find_range(const Range (&ranges)[N], std::uint32_t cp) {
  const Range* it = std::upper_bound(ranges, ranges + N, cp,
                                     [](std::uint32_t c, const Range& r) { return c < r.first; });
  return it != ranges && cp <= (it - 1)->last ? it - 1 : nullptr;
}

// Hangul syllables decompose and compose by arithmetic (Unicode 14.0, section 3.12).
constexpr std::uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr std::uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr std::uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

std::uint32_t combining_class(std::uint32_t cp) {
  const CombiningClassRange* r = find_range(kCombiningClasses, cp);
  return r ? r->ccc : 0;
}

void decompose(std::uint32_t cp, std::vector<std::uint32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const std::uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* end = kDecompositions + sizeof(kDecompositions) / sizeof(kDecompositions[0]);
  const Decomposition* d = std::lower_bound(
      kDecompositions, end, cp, [](const Decomposition& x, std::uint32_t c) { return x.cp < c; });
  if (d == end || d->cp != cp) {
    out->push_back(cp);
    return;
  }
  for (std::uint32_t to : d->to) {
    if (to != 0) out->push_back(to);
  }
}

// The primary composite of the pair, or 0.
std::uint32_t compose(std::uint32_t a, std::uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const Composition* end = kCompositions + sizeof(kCompositions) / sizeof(kCompositions[0]);
  const Composition* c =
      std::lower_bound(kCompositions, end, std::make_pair(a, b),
                       [](const Composition& x, const std::pair<std::uint32_t, std::uint32_t>& p) {
                         return x.first != p.first ? x.first < p.first : x.second < p.second;
                       });
  return c != end && c->first == a && c->second == b ? c->composite : 0;
}

// NFC of a run of well-formed code points, appended to `out` as UTF-8.
void append_nfc(const std::vector<std::uint32_t>& cps, std::string* out) {
  std::vector<std::uint32_t> d;
  for (std::uint32_t cp : cps) decompose(cp, &d);
  // Canonical ordering: each run of combining marks, stably by class.
  for (std::size_t i = 0; i < d.size();) {
    std::size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    if (j > i + 1) {
      std::stable_sort(
          d.begin() + static_cast<std::ptrdiff_t>(i), d.begin() + static_cast<std::ptrdiff_t>(j),
          [](std::uint32_t a, std::uint32_t b) { return combining_class(a) < combining_class(b); });
    }
    i = j > i ? j : i + 1;
  }
  // Canonical composition (UAX #15's sample algorithm): a mark joins the last starter unless a
  // character of class 0 or of a class not lower than its own stands between them.
  std::size_t starter = 0, kept = 0;
  std::uint32_t last_class = 0;
  bool have_starter = false;
  for (std::size_t i = 0; i < d.size(); ++i) {
    const std::uint32_t cc = combining_class(d[i]);
    const bool adjacent = kept > 0 && kept - 1 == starter;
    const std::uint32_t composite =
        have_starter && (adjacent || last_class < cc) ? compose(d[starter], d[i]) : 0;
    if (composite != 0) {
      d[starter] = composite;
      continue;
    }
    if (cc == 0) {
      starter = kept;
      have_starter = true;
    }
    last_class = cc;
    d[kept++] = d[i];
  }
  for (std::size_t i = 0; i < kept; ++i) append_utf8(d[i], out);
}

}  // namespace

std::size_t utf8_next(std::string_view s, std::size_t i, std::uint32_t* cp) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  *cp = kInvalidCodePoint;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  std::size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  std::uint32_t value;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    value = b0 & 0x1Fu;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    value = b0 & 0x0Fu;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    value = b0 & 0x07u;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  std::size_t k = 1;
  for (; k <= need; ++k) {
    if (i + k >= s.size()) return k;
    const unsigned char b = byte(i + k);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return k;
    value = (value << 6) | (b & 0x3Fu);
  }
  *cp = value;
  return k;
}

std::vector<TextChar> text_chars(std::string_view text) {
  std::vector<TextChar> chars;
  text_chars(text, &chars);
  return chars;
}

void text_chars(std::string_view text, std::vector<TextChar>* chars) {
  chars->clear();
  chars->reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {  // ASCII, most of most texts
      chars->push_back({b, i, i + 1});
      ++i;
      continue;
    }
    std::uint32_t cp;
    const std::size_t n = utf8_next(text, i, &cp);
    if (cp == kInvalidCodePoint) {
      for (std::size_t k = 0; k < n; ++k) chars->push_back({kInvalidCodePoint, i + k, i + k + 1});
    } else {
      chars->push_back({cp, i, i + n});
    }
    i += n;
  }
}

std::size_t find_invalid_utf8(std::string_view bytes) {
  for (std::size_t i = 0; i < bytes.size();) {
    // Eight ASCII bytes at a time.
    while (i + 8 <= bytes.size()) {
      std::uint64_t word;
      std::memcpy(&word, bytes.data() + i, 8);
      if ((word & 0x8080808080808080ull) != 0) break;
      i += 8;
    }
    if (i == bytes.size()) break;
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    std::uint32_t cp;
    const std::size_t n = utf8_next(bytes, i, &cp);
    if (cp == kInvalidCodePoint) return i;
    i += n;
  }
  return bytes.size();
}

std::string replace_invalid_utf8(const std::string& bytes) {
  std::string out;
  for (std::size_t i = 0; i < bytes.size();) {
    std::uint32_t cp;
    const std::size_t n = utf8_next(bytes, i, &cp);
    if (cp == kInvalidCodePoint) {
      out += "\xEF\xBF\xBD";
    } else {
      out.append(bytes, i, n);
    }
    i += n;
  }
  return out;
}

bool is_letter(std::uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return cp != kInvalidCodePoint && find_range(kLetterRanges, cp) != nullptr;
}
bool is_number(std::uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return cp != kInvalidCodePoint && find_range(kNumberRanges, cp) != nullptr;
}
bool is_space(std::uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::string nfc(const std::string& text) {
  // Nothing below U+0300 decomposes into something else or composes (tools/gen-unicode-ranges.py
  // checks it), and only lead bytes from 0xCC start characters from U+0300 on.
  if (std::none_of(text.begin(), text.end(),
                   [](char c) { return static_cast<unsigned char>(c) >= 0xCC; })) {
    return text;
  }
  std::string out;
  out.reserve(text.size());
  std::vector<std::uint32_t> run;
  for (const TextChar& c : text_chars(text)) {
    if (c.cp != kInvalidCodePoint) {
      run.push_back(c.cp);
      continue;
    }
    append_nfc(run, &out);
    run.clear();
    out += text[c.begin];
  }
  append_nfc(run, &out);
  return out;
}

}  // namespace kiln::data
