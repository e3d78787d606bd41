#include "data/device_decode.h"

#include <algorithm>

#include "core/check.h"
#include "data/dataset.h"
#include "data/jpeg_region_decoder.h"
#if KILN_WITH_CUDA && defined(KILN_WITH_NVJPEG)
#include "data/cuda/nvjpeg_decoder.h"
#endif

namespace kiln::data {

bool Dataset::get_encoded(std::int64_t, const SampleContext&, EncodedImage*, void*) const {
  throw InputError(describe() + ": this dataset has no encoded images to decode on the device");
}

ResizeCropParams Dataset::device_finish() const {
  throw InputError(describe() + ": this dataset has no encoded images to decode on the device");
}

namespace {

int read16(const std::uint8_t* p) {
  return (p[0] << 8) | p[1];
}

}  // namespace

bool jpeg_decodable_on_device(const std::uint8_t* bytes, std::size_t size, bool* truncated) {
  *truncated = false;
  if (size < 4 || bytes[0] != 0xFF || bytes[1] != 0xD8) return false;
  *truncated = !jpeg_ends_with_eoi(bytes, size);
  if (*truncated) return false;
  bool adobe_rgb = false;
  std::size_t i = 2;
  while (i + 4 <= size) {
    if (bytes[i] != 0xFF) return false;
    const int marker = bytes[i + 1];
    if (marker == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {  // no length
      i += 2;
      continue;
    }
    const std::size_t length = static_cast<std::size_t>(read16(bytes + i + 2));
    if (length < 2 || i + 2 + length > size) return false;
    const std::uint8_t* segment = bytes + i + 4;
    if (marker == 0xEE && length >= 14 && std::equal(segment, segment + 5, "Adobe")) {
      adobe_rgb = segment[11] == 0;  // Adobe's transform flag 0: the components are R, G, B
    }
    const bool start_of_frame =
        marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (start_of_frame) {
      if (marker != 0xC0 || length < 8 + 3 * 3 || segment[0] != 8 || segment[5] != 3) return false;
      const std::uint8_t* c = segment + 6;  // (id, sampling, table) per component
      if ((c[0] == 'R' && c[3] == 'G' && c[6] == 'B') || adobe_rgb) return false;
      if (c[4] != 0x11 || c[7] != 0x11) return false;  // chroma at the lowest resolution
      const int luma = c[1];
      return luma == 0x11 || luma == 0x21 || luma == 0x22 || luma == 0x12;
    }
    if (marker == 0xDA) return false;  // a scan before any frame header
    i += 2 + length;
  }
  return false;
}

std::unique_ptr<DeviceImageDecoder> make_device_image_decoder(Device device, std::string* why) {
#if KILN_WITH_CUDA && defined(KILN_WITH_NVJPEG)
  return make_nvjpeg_decoder(device, why);
#else
  static_cast<void>(device);
#if KILN_WITH_CUDA
  *why = "this Kiln was built without nvJPEG's header (scripts/install-deps.sh installs it)";
#else
  *why = "this Kiln was built without CUDA";
#endif
  return nullptr;
#endif
}

}  // namespace kiln::data
