#include "launch/doctor/facts.h"

#include <cstdint>
#include <cstring>
#include <set>
#include <type_traits>

#include "core/check.h"

namespace kiln::launch::doctor {
namespace {

// Every rank runs the same binary on the same architecture, so numbers travel as their bytes:
// exact, with nothing printed and parsed back. The tag catches bytes of some other writer.
constexpr std::uint32_t kFormatTag = 0x4b444631;  // "KDF1"

class ByteWriter {
 public:
  template <typename T>
  void put(T value) {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, "numbers only");
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
  void put_flag(bool value) { put<std::uint8_t>(value ? 1 : 0); }
  void put_text(const std::string& text) {
    put<std::uint64_t>(text.size());
    bytes_ += text;
  }
  void put_optional_text(const std::optional<std::string>& text) {
    put_flag(text.has_value());
    if (text) put_text(*text);
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

class ByteReader {
 public:
  explicit ByteReader(const std::string& bytes) : bytes_(bytes) {}
  template <typename T>
  T get() {
    T value;
    take(&value, sizeof(value));
    return value;
  }
  bool get_flag() { return get<std::uint8_t>() != 0; }
  std::string get_text() {
    const std::uint64_t size = get<std::uint64_t>();
    require(size <= bytes_.size() - at_);
    std::string text = bytes_.substr(at_, size);
    at_ += size;
    return text;
  }
  std::optional<std::string> get_optional_text() {
    if (!get_flag()) return std::nullopt;
    return get_text();
  }
  bool at_end() const { return at_ == bytes_.size(); }

 private:
  void take(void* out, std::size_t size) {
    require(size <= bytes_.size() - at_);
    std::memcpy(out, bytes_.data() + at_, size);
    at_ += size;
  }
  static void require(bool fits) {
    if (!fits) throw Error("kiln doctor: a rank's facts end early (truncated in transit?)");
  }

  const std::string& bytes_;
  std::size_t at_ = 0;
};

}  // namespace

std::string encode(const RankFacts& facts) {
  ByteWriter out;
  out.put(kFormatTag);
  out.put(facts.rank);
  out.put_text(facts.host);
  out.put(facts.local_rank);
  out.put(facts.local_size);
  out.put(facts.gpu_count);
  out.put_flag(facts.gpu.has_value());
  if (const auto& gpu = facts.gpu) {
    out.put(gpu->index);
    out.put_text(gpu->name);
    out.put_text(gpu->pci_bus_id);
    out.put_flag(gpu->nvml);
    out.put_text(gpu->nvml_status);
    for (double value : {gpu->temperature_c, gpu->power_w, gpu->power_limit_w, gpu->sm_clock_mhz,
                         gpu->sm_clock_max_mhz}) {
      out.put(value);
    }
  }
  out.put_flag(facts.peer_access.has_value());
  if (const auto& peer = facts.peer_access) {
    out.put(peer->pairs);
    out.put(peer->with_access);
    out.put_text(peer->gpu_names);
  }
  out.put<std::uint64_t>(facts.interfaces.size());
  for (const Interface& i : facts.interfaces) {
    out.put_text(i.name);
    out.put_text(i.address);
    out.put_flag(i.up);
  }
  out.put_text(facts.nccl_interface);
  out.put_optional_text(facts.nccl_socket_ifname);
  out.put_optional_text(facts.nccl_p2p_disable);
  out.put_optional_text(facts.nccl_ib_disable);
  out.put_flag(facts.write.has_value());
  if (const auto& write = facts.write) {
    out.put_text(write->dir);
    out.put(write->bytes);
    out.put(write->seconds);
    out.put_text(write->error);
  }
  return out.bytes();
}

RankFacts decode(const std::string& bytes) {
  ByteReader in(bytes);
  if (in.get<std::uint32_t>() != kFormatTag) {
    throw Error("kiln doctor: a rank's facts are not in this build's format (mixed Kiln builds?)");
  }
  RankFacts facts;
  facts.rank = in.get<int>();
  facts.host = in.get_text();
  facts.local_rank = in.get<int>();
  facts.local_size = in.get<int>();
  facts.gpu_count = in.get<int>();
  if (in.get_flag()) {
    GpuFacts& gpu = facts.gpu.emplace();
    gpu.index = in.get<int>();
    gpu.name = in.get_text();
    gpu.pci_bus_id = in.get_text();
    gpu.nvml = in.get_flag();
    gpu.nvml_status = in.get_text();
    for (double* value : {&gpu.temperature_c, &gpu.power_w, &gpu.power_limit_w, &gpu.sm_clock_mhz,
                          &gpu.sm_clock_max_mhz}) {
      *value = in.get<double>();
    }
  }
  if (in.get_flag()) {
    PeerAccessFacts& peer = facts.peer_access.emplace();
    peer.pairs = in.get<int>();
    peer.with_access = in.get<int>();
    peer.gpu_names = in.get_text();
  }
  const std::uint64_t interfaces = in.get<std::uint64_t>();
  for (std::uint64_t n = 0; n < interfaces; ++n) {
    Interface i;
    i.name = in.get_text();
    i.address = in.get_text();
    i.up = in.get_flag();
    facts.interfaces.push_back(i);
  }
  facts.nccl_interface = in.get_text();
  facts.nccl_socket_ifname = in.get_optional_text();
  facts.nccl_p2p_disable = in.get_optional_text();
  facts.nccl_ib_disable = in.get_optional_text();
  if (in.get_flag()) {
    WriteResult& write = facts.write.emplace();
    write.dir = in.get_text();
    write.bytes = in.get<double>();
    write.seconds = in.get<double>();
    write.error = in.get_text();
  }
  if (!in.at_end()) throw Error("kiln doctor: a rank's facts have bytes after their end");
  return facts;
}

std::string interface_list(const std::vector<Interface>& interfaces) {
  std::string list;
  for (const Interface& i : interfaces) {
    list += (list.empty() ? "" : ", ") + i.name + " " + i.address + (i.up ? "" : " (down)");
  }
  return list;
}

int host_count(const std::vector<RankFacts>& ranks) {
  std::set<std::string> hosts;
  for (const RankFacts& f : ranks) hosts.insert(f.host);
  return static_cast<int>(hosts.size());
}

}  // namespace kiln::launch::doctor
