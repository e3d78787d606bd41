#pragma once
// One checking family for every library Kiln calls. Each KILN_*_CHECK macro turns a failed call
// into a kiln::Error whose message names the library's own error string, the failing
// expression, function, file:line, rank, host and device, and where it helps, what to check.
// Library-specific macros live beside the code that includes the library's header
// (core/cuda/cuda_check.h, comm/mpi_check.h, comm/nccl_check.h); all use report_failure().

#include <cstdint>
#include <stdexcept>
#include <string>

namespace kiln {

// Base of every error Kiln reports; main() prints what() and exits non-zero.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A bad user input (config, command line, data file, checkpoint): the message is the whole story,
// no source location; the command exits with code 2.
class InputError : public Error {
 public:
  explicit InputError(const std::string& message) : Error(message) {}
};

// Out of memory is recoverable (autobatch retries with a smaller batch), so it has its own type.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(const std::string& message, std::size_t requested)
      : Error(message), requested_bytes(requested) {}
  std::size_t requested_bytes;
};

struct SourceSite {
  const char* expression;
  const char* function;
  const char* file;
  int line;
};

// Who this process is, for messages: set once by comm/ when the world is known.
void set_process_identity(int rank, int world_size);
std::string process_identity();  // "rank 1/4 on host gpu07" or "host gpu07"

// The CUDA device current on this thread, or -1; core/cuda fills this in when CUDA is present.
using CurrentDeviceQuery = int (*)();
void set_current_device_query(CurrentDeviceQuery query);

[[noreturn]] void report_failure(const char* library, const std::string& error_string,
                                 const SourceSite& site, const std::string& hint = "");

std::string format_bytes(std::size_t bytes);  // "2.0 GiB"

}  // namespace kiln

#define KILN_SITE(expr)                \
  ::kiln::SourceSite {                 \
    expr, __func__, __FILE__, __LINE__ \
  }

// An internal invariant: a failure is a bug in Kiln, reported with its location.
#define KILN_CHECK(cond, message)                                  \
  do {                                                             \
    if (!(cond)) {                                                 \
      ::kiln::report_failure("kiln", (message), KILN_SITE(#cond)); \
    }                                                              \
  } while (0)

// A deliberate ignore of a library status, greppable.
#define KILN_IGNORE_ERROR(expr) static_cast<void>(expr)
