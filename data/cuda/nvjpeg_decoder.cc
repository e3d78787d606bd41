#include "data/cuda/nvjpeg_decoder.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nvjpeg.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/stream.h"
#include "data/image_datasets.h"

namespace kiln::data {
namespace {

const char* status_name(nvjpegStatus_t status) {
  switch (status) {
    case NVJPEG_STATUS_SUCCESS:
      return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED:
      return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER:
      return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG:
      return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
      return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE:
      return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED:
      return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH:
      return "architecture mismatch";
    case NVJPEG_STATUS_INTERNAL_ERROR:
      return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
      return "implementation not supported";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM:
      return "incomplete bitstream";
  }
  return "unknown status";
}

#define KILN_NVJPEG_CHECK(expr)                                                      \
  do {                                                                               \
    nvjpegStatus_t kiln_status_ = (expr);                                            \
    if (kiln_status_ != NVJPEG_STATUS_SUCCESS) {                                     \
      ::kiln::report_failure("nvJPEG", status_name(kiln_status_), KILN_SITE(#expr)); \
    }                                                                                \
  } while (0)

// The entry points Kiln calls, from libnvjpeg.so.13 opened at run time.
struct NvjpegLibrary {
  decltype(&nvjpegCreateEx) create_ex = nullptr;
  decltype(&nvjpegDestroy) destroy = nullptr;
  decltype(&nvjpegJpegStateCreate) state_create = nullptr;
  decltype(&nvjpegJpegStateDestroy) state_destroy = nullptr;
  decltype(&nvjpegDecodeBatchedInitialize) batched_initialize = nullptr;
  decltype(&nvjpegDecodeBatched) decode_batched = nullptr;
  decltype(&nvjpegJpegStreamCreate) stream_create = nullptr;
  decltype(&nvjpegJpegStreamDestroy) stream_destroy = nullptr;
  decltype(&nvjpegJpegStreamParseHeader) stream_parse_header = nullptr;
  decltype(&nvjpegDecodeBatchedSupported) batched_supported = nullptr;
  decltype(&nvjpegGetHardwareDecoderInfo) hardware_info = nullptr;
};

template <typename F>
bool resolve(void* library, const char* name, F* entry, std::string* why) {
  *entry = reinterpret_cast<F>(dlsym(library, name));
  if (*entry == nullptr) *why = std::string("libnvjpeg has no ") + name;
  return *entry != nullptr;
}

// Opened once per process; nullptr with *why when no copy loads.
const NvjpegLibrary* nvjpeg_library(std::string* why) {
  static std::mutex mutex;
  static bool tried = false;
  static NvjpegLibrary library;
  static std::string failure;
  std::lock_guard<std::mutex> lock(mutex);
  if (!tried) {
    tried = true;
    std::vector<std::string> names;
    if (const char* path = std::getenv("KILN_NVJPEG_LIBRARY")) names.emplace_back(path);
    names.insert(names.end(), {"libnvjpeg.so.13", "/usr/local/cuda/lib64/libnvjpeg.so.13",
                               "/usr/local/cuda/targets/x86_64-linux/lib/libnvjpeg.so.13"});
    void* handle = nullptr;
    for (const std::string& name : names) {
      handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) break;
      if (failure.empty()) failure = dlerror();
    }
    if (handle == nullptr) {
      failure = "cannot load libnvjpeg.so.13 (" + failure +
                "); put its folder on LD_LIBRARY_PATH or name the file in KILN_NVJPEG_LIBRARY";
    } else {
      failure.clear();
      NvjpegLibrary l;
      if (resolve(handle, "nvjpegCreateEx", &l.create_ex, &failure) &&
          resolve(handle, "nvjpegDestroy", &l.destroy, &failure) &&
          resolve(handle, "nvjpegJpegStateCreate", &l.state_create, &failure) &&
          resolve(handle, "nvjpegJpegStateDestroy", &l.state_destroy, &failure) &&
          resolve(handle, "nvjpegDecodeBatchedInitialize", &l.batched_initialize, &failure) &&
          resolve(handle, "nvjpegDecodeBatched", &l.decode_batched, &failure) &&
          resolve(handle, "nvjpegJpegStreamCreate", &l.stream_create, &failure) &&
          resolve(handle, "nvjpegJpegStreamDestroy", &l.stream_destroy, &failure) &&
          resolve(handle, "nvjpegJpegStreamParseHeader", &l.stream_parse_header, &failure) &&
          resolve(handle, "nvjpegDecodeBatchedSupported", &l.batched_supported, &failure) &&
          resolve(handle, "nvjpegGetHardwareDecoderInfo", &l.hardware_info, &failure)) {
        library = l;
      }
    }
  }
  if (!failure.empty()) {
    *why = failure;
    return nullptr;
  }
  return &library;
}

class NvjpegDecoder final : public DeviceImageDecoder {
 public:
  NvjpegDecoder(const NvjpegLibrary& nv, Device device) : nv_(nv), device_(device) {}
  ~NvjpegDecoder() override {
    if (jpeg_stream_ != nullptr) KILN_IGNORE_ERROR(nv_.stream_destroy(jpeg_stream_));
    if (state_ != nullptr) KILN_IGNORE_ERROR(nv_.state_destroy(state_));
    if (handle_ != nullptr) KILN_IGNORE_ERROR(nv_.destroy(handle_));
  }

  // Tries the hardware engine first (unless KILN_NVJPEG_BACKEND=gpu), then the CUDA decoder.
  bool open(std::string* why) {
    const char* forced = std::getenv("KILN_NVJPEG_BACKEND");
    const bool gpu_only = forced != nullptr && std::strcmp(forced, "gpu") == 0;
    // Strict: a damaged bitstream is an error, not partly grey pixels (TurboJPEG's rule here).
    // Interpolated chroma upsampling: libjpeg-turbo's default ("fancy" upsampling).
    // No pipelining: by default the hardware engine's batched decode keeps images buffered
    // across calls; each batch here must be complete in stream order before its kernel runs.
    const unsigned flags = NVJPEG_FLAGS_BITSTREAM_STRICT |
                           NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION |
                           NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE;
    for (nvjpegBackend_t backend : {NVJPEG_BACKEND_HARDWARE, NVJPEG_BACKEND_GPU_HYBRID}) {
      if (backend == NVJPEG_BACKEND_HARDWARE && gpu_only) continue;
      for (unsigned f :
           {flags, flags & ~static_cast<unsigned>(NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION)}) {
        if (nv_.create_ex(backend, nullptr, nullptr, f, &handle_) == NVJPEG_STATUS_SUCCESS) {
          hardware_ = backend == NVJPEG_BACKEND_HARDWARE;
          interpolated_ = f == flags;
          break;
        }
        handle_ = nullptr;
      }
      if (handle_ != nullptr) break;
    }
    if (handle_ == nullptr) {
      *why = "nvJPEG found no decoder for this GPU (neither the hardware engine nor CUDA)";
      return false;
    }
    if (hardware_) {
      KILN_IGNORE_ERROR(nv_.hardware_info(handle_, &engines_, &cores_per_engine_));
    }
    KILN_NVJPEG_CHECK(nv_.state_create(handle_, &state_));
    KILN_NVJPEG_CHECK(nv_.stream_create(handle_, &jpeg_stream_));
    return true;
  }

  std::string describe() const override {
    std::string out = hardware_ ? "nvJPEG hardware decoder (" + std::to_string(engines_) +
                                      " engines x " + std::to_string(cores_per_engine_) + " cores)"
                                : "nvJPEG CUDA decoder";
    return out + (interpolated_ ? ", interpolated chroma" : ", nearest chroma");
  }

  void decode(const std::vector<EncodedImage>& images, const ResizeCropParams& finish, Tensor& out,
              const Event& out_ready, void* stream, const Replace& replace) override {
    const std::size_t count = images.size();
    auto cuda_stream = static_cast<cudaStream_t>(stream);
    // Every image's full-size RGB in one pooled buffer, rows of width * 3 bytes.
    std::vector<ResizeCropSample> samples(count);
    std::int64_t total = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const EncodedImage& image = images[i];
      ResizeCropSample& s = samples[i];
      s.offset = total;
      s.width = image.width;
      s.height = image.height;
      s.box = image.box;
      s.flip = image.flip ? 1 : 0;
      s.shift_x = image.shift_x;
      s.shift_y = image.shift_y;
      total += (static_cast<std::int64_t>(image.width) * image.height * 3 + 255) / 256 * 256;
    }
    ensure_pixels(total, cuda_stream);
    auto* pixels = static_cast<std::uint8_t*>(pixels_.data());

    // The batched decoder takes the files it supports; the rest (and the worker-decoded ones) are
    // uploaded from host pixels.
    std::vector<std::size_t> batched;
    std::vector<const unsigned char*> data;
    std::vector<std::size_t> lengths;
    std::vector<nvjpegImage_t> destinations;
    std::vector<bool> replaced(count, false);
    for (std::size_t i = 0; i < count; ++i) {
      const EncodedImage& image = images[i];
      if (!image.rgb.empty()) {
        upload(image.rgb, pixels + samples[i].offset, cuda_stream);
        continue;
      }
      if (!supported(image)) {
        replaced[i] = !host_decode(images[i], pixels + samples[i].offset, &samples[i], cuda_stream);
        continue;
      }
      batched.push_back(i);
      data.push_back(image.bytes.data());
      lengths.push_back(image.bytes.size());
      nvjpegImage_t destination{};
      destination.channel[0] = pixels + samples[i].offset;
      destination.pitch[0] = static_cast<std::size_t>(image.width) * 3;
      destinations.push_back(destination);
    }
    if (!batched.empty()) {
      const int n = static_cast<int>(batched.size());
      if (n != initialized_batch_) {
        KILN_NVJPEG_CHECK(nv_.batched_initialize(handle_, state_, n, 1, NVJPEG_OUTPUT_RGBI));
        initialized_batch_ = n;
      }
      const nvjpegStatus_t status = nv_.decode_batched(handle_, state_, data.data(), lengths.data(),
                                                       destinations.data(), cuda_stream);
      if (status != NVJPEG_STATUS_SUCCESS) {
        // One bad file fails the whole batch: decode each of them on the host instead, which names
        // (or replaces) the one that is corrupt. The batch state starts over.
        initialized_batch_ = -1;
        for (std::size_t i : batched) {
          replaced[i] =
              !host_decode(images[i], pixels + samples[i].offset, &samples[i], cuda_stream);
        }
      }
    }
    out_ready.wait_on(stream);
    samples_device_ = Tensor::empty({static_cast<std::int64_t>(count * sizeof(ResizeCropSample))},
                                    DType::U8, device_);
    KILN_CUDA_CHECK(cudaMemcpyAsync(samples_device_.data(), samples.data(),
                                    count * sizeof(ResizeCropSample), cudaMemcpyHostToDevice,
                                    cuda_stream));
    resize_crop_batch_cuda(pixels, static_cast<const ResizeCropSample*>(samples_device_.data()),
                           static_cast<int>(count), finish, static_cast<float*>(out.data()),
                           stream);
    // Rows of files no decoder takes: the dataset's replacement overwrites the kernel's dummy.
    for (std::size_t i = 0; i < count; ++i) {
      if (!replaced[i]) continue;
      const std::size_t plane = static_cast<std::size_t>(finish.out_width) * finish.out_height * 3;
      replaced_.resize(plane);
      replace(i, replaced_.data());
      KILN_CUDA_CHECK(cudaMemcpyAsync(static_cast<float*>(out.data()) + i * plane, replaced_.data(),
                                      plane * sizeof(float), cudaMemcpyHostToDevice, cuda_stream));
    }
  }

 private:
  void ensure_pixels(std::int64_t bytes, cudaStream_t stream) {
    if (pixels_.defined() && pixels_.numel() >= bytes) return;
    // The buffer is reused batch after batch on this one stream; the old one may still be read.
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
    StreamGuard guard(device_, stream);
    pixels_ = Tensor();
    pixels_ = Tensor::empty({bytes + bytes / 4}, DType::U8, device_);
  }

  bool supported(const EncodedImage& image) {
    if (nv_.stream_parse_header(handle_, image.bytes.data(), image.bytes.size(), jpeg_stream_) !=
        NVJPEG_STATUS_SUCCESS) {
      return false;
    }
    int is_supported = 1;
    if (nv_.batched_supported(handle_, jpeg_stream_, &is_supported) != NVJPEG_STATUS_SUCCESS) {
      return false;
    }
    return is_supported == 0;  // nvJPEG's convention: 0 is supported
  }

  // pageable memory: the copy has taken the bytes when cudaMemcpyAsync returns.
  static void upload(const std::vector<std::uint8_t>& rgb, std::uint8_t* at, cudaStream_t stream) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(at, rgb.data(), rgb.size(), cudaMemcpyHostToDevice, stream));
  }

  // TurboJPEG at full size. False for a file it refuses too: the sample then reads a 1 x 1 pixel
  // of the buffer (its row is replaced after the kernel).
  static bool host_decode(const EncodedImage& image, std::uint8_t* at, ResizeCropSample* sample,
                          cudaStream_t stream) {
    std::vector<std::uint8_t> rgb;
    int width = 0, height = 0;
    std::string error;
    if (decode_jpeg_rgb(image.bytes.data(), image.bytes.size(), &rgb, &width, &height, &error) &&
        width == image.width && height == image.height) {
      upload(rgb, at, stream);
      return true;
    }
    *sample = ResizeCropSample{};
    sample->width = sample->height = 1;
    sample->box = CropBox{0, 0, 1, 1};
    return false;
  }

  const NvjpegLibrary& nv_;
  Device device_;
  nvjpegHandle_t handle_ = nullptr;
  nvjpegJpegState_t state_ = nullptr;
  nvjpegJpegStream_t jpeg_stream_ = nullptr;
  bool hardware_ = false, interpolated_ = false;
  unsigned engines_ = 0, cores_per_engine_ = 0;
  int initialized_batch_ = -1;
  Tensor pixels_;          // the batch's decoded images, reused
  Tensor samples_device_;  // the kernel's per-sample parameters
  std::vector<float> replaced_;
};

}  // namespace

std::unique_ptr<DeviceImageDecoder> make_nvjpeg_decoder(Device device, std::string* why) {
  const NvjpegLibrary* nv = nvjpeg_library(why);
  if (nv == nullptr) return nullptr;
  auto decoder = std::make_unique<NvjpegDecoder>(*nv, device);
  if (!decoder->open(why)) return nullptr;
  return decoder;
}

}  // namespace kiln::data
