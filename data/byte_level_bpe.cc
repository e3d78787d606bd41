#include "data/byte_level_bpe.h"

#include <algorithm>
#include <queue>

#include "core/check.h"
#include "core/json_string.h"
#include "data/unicode_text.h"

namespace kiln::data {
namespace {

// Reverse of gpt2_byte_symbols(): symbol code point -> byte.
const std::unordered_map<std::uint32_t, unsigned char>& symbol_bytes() {
  static const std::unordered_map<std::uint32_t, unsigned char> map = [] {
    std::unordered_map<std::uint32_t, unsigned char> m;
    const auto& symbols = gpt2_byte_symbols();
    for (int b = 0; b < 256; ++b) {
      std::uint32_t cp;
      utf8_next(symbols[static_cast<std::size_t>(b)], 0, &cp);
      m[cp] = static_cast<unsigned char>(b);
    }
    return m;
  }();
  return map;
}

std::string byte_symbols(std::string_view bytes) {
  std::string s;
  for (unsigned char b : bytes) s += gpt2_byte_symbols()[b];
  return s;
}

}  // namespace

const std::vector<std::string>& gpt2_byte_symbols() {
  static const std::vector<std::string> symbols = [] {
    std::vector<std::string> s(256);
    std::uint32_t next = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      append_utf8(printable ? b : next++, &s[b]);
    }
    return s;
  }();
  return symbols;
}

bool byte_symbols_to_bytes(const std::string& symbols, std::string* bytes) {
  const auto& bytes_of = symbol_bytes();
  for (std::size_t i = 0; i < symbols.size();) {
    std::uint32_t cp;
    i += utf8_next(symbols, i, &cp);
    auto it = bytes_of.find(cp);
    if (it == bytes_of.end()) return false;
    *bytes += static_cast<char>(it->second);
  }
  return true;
}

ByteLevelBpe::ByteLevelBpe(const std::vector<std::pair<std::string, std::int64_t>>& vocab,
                           const std::vector<std::pair<std::string, std::string>>& merges,
                           const BpeOptions& options, std::string source)
    : source_(std::move(source)), options_(options) {
  for (const auto& [token, id] : vocab) {
    if (id < 0 || id > 0xFFFFFFFFll) {
      throw InputError(source_ + ": token '" + token + "' has the " +
                       (id < 0 ? "negative id " + std::to_string(id)
                               : "id " + std::to_string(id) + ", past 4294967295"));
    }
    if (!ids_.emplace(token, id).second) {
      throw InputError(source_ + ": token '" + token + "' appears twice");
    }
    auto [at, fresh] = tokens_.emplace(id, token);
    if (!fresh) {
      throw InputError(source_ + ": id " + std::to_string(id) + " belongs to both '" + at->second +
                       "' and '" + token + "'");
    }
    largest_ = std::max(largest_, id);
  }
  for (std::size_t b = 0; b < 256; ++b) byte_ids_[b] = id(gpt2_byte_symbols()[b]);
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& a = merges[rank].first;
    const std::string& b = merges[rank].second;
    const auto bad = [&](const std::string& symbol) {
      return InputError(source_ + ": the merge of rank " + std::to_string(rank) + " ('" + a + " " +
                        b + "'): " + symbol + " is not in the vocabulary");
    };
    const std::int64_t ia = id(a), ib = id(b), result = id(a + b);
    if (ia < 0 || ib < 0) throw bad("'" + (ia < 0 ? a : b) + "'");
    if (result < 0) throw bad("its result '" + a + b + "'");
    merges_[pair_key(ia, ib)] = {static_cast<std::uint32_t>(rank), result};
  }
  if (!options_.unk_token.empty()) {
    unk_id_ = id(options_.unk_token);
    if (unk_id_ < 0) {
      throw InputError(source_ + ": the unk_token '" + options_.unk_token +
                       "' is not in the vocabulary");
    }
  }
}

const std::string* ByteLevelBpe::token(std::int64_t id) const {
  auto it = tokens_.find(id);
  return it == tokens_.end() ? nullptr : &it->second;
}

std::int64_t ByteLevelBpe::id(const std::string& token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

BpePieceCache::BpePieceCache(std::size_t max_pieces)
    : max_pieces_(std::max<std::size_t>(max_pieces, 8)), slots_(16) {}

void BpePieceCache::clear() {
  std::fill(slots_.begin(), slots_.end(), Slot{});
  keys_.clear();
  ids_.clear();
  count_ = 0;
}

void BpePieceCache::grow() {
  std::vector<Slot> old(slots_.size() * 2);
  old.swap(slots_);
  const std::size_t mask = slots_.size() - 1;
  for (const Slot& slot : old) {
    if (slot.id_count == 0) continue;
    std::size_t i = slot.hash & mask;
    while (slots_[i].id_count != 0) i = (i + 1) & mask;
    slots_[i] = slot;
  }
}

bool BpePieceCache::find(std::string_view piece, std::vector<std::int64_t>* ids) const {
  const std::size_t hash = std::hash<std::string_view>{}(piece);
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& slot = slots_[i];
    if (slot.id_count == 0) return false;
    if (slot.hash == hash && std::string_view(keys_).substr(slot.key, slot.key_size) == piece) {
      ids->insert(ids->end(), ids_.begin() + slot.ids, ids_.begin() + slot.ids + slot.id_count);
      return true;
    }
  }
}

void BpePieceCache::insert(std::string_view piece, const std::int64_t* ids, std::size_t n) {
  // Pieces too long to repeat, or beyond the 32-bit offsets, are not kept.
  if (n == 0 || piece.size() > 256 || keys_.size() + piece.size() > 0xFFFFFFFFu ||
      ids_.size() + n > 0xFFFFFFFFu) {
    return;
  }
  if (count_ >= max_pieces_) clear();
  if (2 * (count_ + 1) > slots_.size()) grow();  // at most half full: probes stay short
  const std::size_t hash = std::hash<std::string_view>{}(piece);
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = hash & mask;
  while (slots_[i].id_count != 0) {
    if (slots_[i].hash == hash &&
        std::string_view(keys_).substr(slots_[i].key, slots_[i].key_size) == piece) {
      return;  // already here
    }
    i = (i + 1) & mask;
  }
  slots_[i] = {hash, static_cast<std::uint32_t>(keys_.size()),
               static_cast<std::uint32_t>(piece.size()), static_cast<std::uint32_t>(ids_.size()),
               static_cast<std::uint32_t>(n)};
  keys_.append(piece);
  ids_.insert(ids_.end(), ids, ids + n);
  ++count_;
}

void ByteLevelBpe::encode_piece(std::string_view piece, std::vector<std::int64_t>* ids,
                                BpePieceCache* cache) const {
  if (piece.empty()) return;
  if (cache != nullptr && cache->find(piece, ids)) return;
  const std::size_t first = ids->size();
  encode_uncached(piece, ids);
  if (cache != nullptr) cache->insert(piece, ids->data() + first, ids->size() - first);
}

void ByteLevelBpe::encode_uncached(std::string_view piece, std::vector<std::int64_t>* ids) const {
  if (options_.ignore_merges) {
    const std::int64_t whole = id(byte_symbols(piece));
    if (whole >= 0) {
      ids->push_back(whole);
      return;
    }
  }
  std::vector<std::int64_t> word;
  word.reserve(piece.size());
  bool unk_pending = false;  // an unk_token that more unknown bytes may still fuse into
  for (unsigned char b : piece) {
    const std::int64_t symbol = byte_ids_[b];
    if (symbol >= 0) {
      if (unk_pending) word.push_back(unk_id_);
      unk_pending = false;
      word.push_back(symbol);
    } else if (unk_id_ >= 0) {
      if (unk_pending && !options_.fuse_unk) word.push_back(unk_id_);
      unk_pending = true;
    } else {
      throw InputError(source_ + ": the symbol '" + gpt2_byte_symbols()[b] +
                       "' (of the text's piece '" + replace_invalid_utf8(std::string(piece)) +
                       "') is not in the vocabulary; a byte-level BPE vocabulary has all 256 "
                       "byte symbols");
    }
  }
  if (unk_pending) word.push_back(unk_id_);
  merge_all(&word);
  ids->insert(ids->end(), word.begin(), word.end());
}

void ByteLevelBpe::merge_all(std::vector<std::int64_t>* word) const {
  struct Symbol {
    std::int64_t id;
    std::ptrdiff_t prev, next;  // -1: none
    bool removed;
  };
  struct Candidate {
    std::size_t pos;
    std::uint32_t rank;
    std::int64_t result;
  };
  // A min-queue on (rank, position).
  const auto after = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(after)> queue(after);
  const auto push_pair = [&](std::size_t pos, std::int64_t left, std::int64_t right) {
    auto it = merges_.find(pair_key(left, right));
    if (it != merges_.end()) queue.push({pos, it->second.rank, it->second.result});
  };
  const std::size_t n = word->size();
  std::vector<Symbol> s(n);
  for (std::size_t i = 0; i < n; ++i) {
    s[i] = {(*word)[i], static_cast<std::ptrdiff_t>(i) - 1,
            i + 1 < n ? static_cast<std::ptrdiff_t>(i + 1) : -1, false};
    if (i + 1 < n) push_pair(i, (*word)[i], (*word)[i + 1]);
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = s[top.pos];
    if (left.removed || left.next < 0) continue;
    Symbol& right = s[static_cast<std::size_t>(left.next)];
    // A stale candidate: the pair at its position has changed since it was queued.
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.result != top.result) continue;
    left.id = top.result;
    left.next = right.next;
    right.removed = true;
    if (left.next >= 0)
      s[static_cast<std::size_t>(left.next)].prev = static_cast<std::ptrdiff_t>(top.pos);
    if (left.prev >= 0) {
      const auto prev = static_cast<std::size_t>(left.prev);
      push_pair(prev, s[prev].id, left.id);
    }
    if (left.next >= 0) push_pair(top.pos, left.id, s[static_cast<std::size_t>(left.next)].id);
  }
  word->clear();
  for (const Symbol& symbol : s) {
    if (!symbol.removed) word->push_back(symbol.id);
  }
}

}  // namespace kiln::data
