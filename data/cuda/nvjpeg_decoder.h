#pragma once
// nvJPEG behind DeviceImageDecoder (data/device_decode.h). libnvjpeg is opened at run time, so a
// Kiln binary starts on machines without it and says so only when data.decode asks for it.

#include <memory>
#include <string>

#include "data/device_decode.h"

namespace kiln::data {

// The hardware JPEG engine's batched decoder where the GPU has one (A100, H100, H200), else the
// CUDA one (Huffman decoding on the GPU for batches above 100 images, as on an RTX 4090);
// KILN_NVJPEG_BACKEND=gpu forces the CUDA one where there is hardware (how the H200 tests the
// 4090's path).
std::unique_ptr<DeviceImageDecoder> make_nvjpeg_decoder(Device device, std::string* why);

}  // namespace kiln::data
