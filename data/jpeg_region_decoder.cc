#include "data/jpeg_region_decoder.h"

#include <setjmp.h>

#include <algorithm>
#include <cstdio>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

#include "core/check.h"

namespace kiln::data {

bool jpeg_ends_with_eoi(const std::uint8_t* bytes, std::size_t size) {
  const std::size_t first = size > 4096 ? size - 4096 : 0;
  for (std::size_t i = size - 1; i > first; --i) {
    if (bytes[i - 1] == 0xFF && bytes[i] == 0xD9) return true;
  }
  return false;
}

namespace {

// libjpeg reports errors through error_exit, which must not return: it jumps back to the decode
// call. Warnings (corrupt entropy data, a premature end) count as errors too, as TurboJPEG's
// TJFLAG_STOPONWARNING makes them on the whole-image path.
struct JumpingErrors {
  jpeg_error_mgr manager;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jump_on_error(j_common_ptr info) {
  auto* errors = reinterpret_cast<JumpingErrors*>(info->err);
  (*info->err->format_message)(info, errors->message);
  longjmp(errors->jump, 1);
}

void jump_on_warning(j_common_ptr info, int level) {
  if (level < 0) jump_on_error(info);
}

// One decompressor per worker thread, made on first use and after a failure.
struct ThreadDecompressor {
  jpeg_decompress_struct info;
  JumpingErrors errors;
  bool made = false;
  ~ThreadDecompressor() { reset(); }
  void reset() {
    if (made) jpeg_destroy_decompress(&info);
    made = false;
  }
  j_decompress_ptr get() {
    if (!made) {
      info.err = jpeg_std_error(&errors.manager);
      errors.manager.error_exit = jump_on_error;
      errors.manager.emit_message = jump_on_warning;
      jpeg_create_decompress(&info);
      made = true;
    }
    return &info;
  }
};

// Everything between setjmp and a longjmp lives in `region` or libjpeg's own state: no C++ object
// with a destructor is made here.
bool decode_rows(j_decompress_ptr info, JumpingErrors* errors, const std::uint8_t* bytes,
                 std::size_t size, int eighths, CropBox part, bool read_to_end,
                 DecodedRegion* region) {
  if (setjmp(errors->jump)) return false;
  jpeg_mem_src(info, bytes, static_cast<unsigned long>(size));
  jpeg_read_header(info, TRUE);
  info->out_color_space = JCS_EXT_RGB;
  info->scale_num = static_cast<unsigned int>(eighths);
  info->scale_denom = 8;
  jpeg_start_decompress(info);
  const int width = static_cast<int>(info->output_width);
  const int height = static_cast<int>(info->output_height);
  // One pixel more on each side than asked: libjpeg's fancy upsampling repeats the edge sample at
  // a cropped edge, where the whole image's decode would blend in its neighbour.
  const int first_column = std::clamp(part.x - 1, 0, width - 1);
  const int last_column = std::clamp(part.x + part.width, first_column, width - 1);
  const int first_row = std::clamp(part.y - 1, 0, height - 1);
  const int last_row = std::clamp(part.y + part.height, first_row, height - 1);
  JDIMENSION x0 = static_cast<JDIMENSION>(first_column);
  JDIMENSION columns = static_cast<JDIMENSION>(last_column - first_column + 1);
  if (columns < info->output_width) jpeg_crop_scanline(info, &x0, &columns);
  if (first_row > 0) jpeg_skip_scanlines(info, static_cast<JDIMENSION>(first_row));
  region->x0 = static_cast<int>(x0);
  region->y0 = first_row;
  region->columns = static_cast<int>(columns);
  region->rows = last_row - first_row + 1;
  region->width = width;
  region->height = height;
  // One row more than the part: where the rows after it are read and dropped when the file is
  // read to its end (jpeg_skip_scanlines would jump to the end without decoding them).
  const std::size_t stride = static_cast<std::size_t>(columns) * 3;
  const std::size_t bytes_needed = stride * (region->rows + 1);
  if (region->rgb.size() < bytes_needed) region->rgb.resize(bytes_needed);
  for (int row = 0; row < region->rows; ++row) {
    JSAMPROW out = region->rgb.data() + stride * row;
    jpeg_read_scanlines(info, &out, 1);
  }
  if (read_to_end) {
    JSAMPROW dropped = region->rgb.data() + stride * region->rows;
    while (info->output_scanline < info->output_height) jpeg_read_scanlines(info, &dropped, 1);
    jpeg_finish_decompress(info);
  } else {
    jpeg_abort_decompress(info);
  }
  return true;
}

bool read_coefficients(j_decompress_ptr info, JumpingErrors* errors, const std::uint8_t* bytes,
                       std::size_t size) {
  if (setjmp(errors->jump)) return false;
  jpeg_mem_src(info, bytes, static_cast<unsigned long>(size));
  jpeg_read_header(info, TRUE);
  jpeg_read_coefficients(info);
  jpeg_finish_decompress(info);
  return true;
}

ThreadDecompressor& thread_decompressor() {
  thread_local ThreadDecompressor decompressor;
  return decompressor;
}

bool usable_size(std::size_t size, std::string* error) {
  if (size == 0 || size > 0xffffffffu) {
    *error = "empty or oversized file";
    return false;
  }
  return true;
}

}  // namespace

bool jpeg_entropy_decode(const std::uint8_t* bytes, std::size_t size, std::string* error) {
  if (!usable_size(size, error)) return false;
  ThreadDecompressor& decompressor = thread_decompressor();
  if (read_coefficients(decompressor.get(), &decompressor.errors, bytes, size)) return true;
  *error = decompressor.errors.message;
  decompressor.reset();
  return false;
}

bool decode_jpeg_region(const std::uint8_t* bytes, std::size_t size, int eighths, CropBox part,
                        DecodedRegion* region, std::string* error) {
  KILN_CHECK(eighths >= 1 && eighths <= 8,
             "decode_jpeg_region: scale " + std::to_string(eighths) + "/8 is not in 1/8 .. 8/8");
  if (!usable_size(size, error)) return false;
  ThreadDecompressor& decompressor = thread_decompressor();
  const bool read_to_end = !jpeg_ends_with_eoi(bytes, size);
  if (decode_rows(decompressor.get(), &decompressor.errors, bytes, size, eighths, part, read_to_end,
                  region)) {
    return true;
  }
  *error = decompressor.errors.message;
  decompressor.reset();
  return false;
}

}  // namespace kiln::data
