#pragma once
// Helpers shared by the communicators' sources (not part of the public API).

#include <mpi.h>

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"

namespace kiln::detail {

// An MPI type of the same size as one element of `dtype`, for moving bytes (never for MPI's own
// reductions: Kiln folds values itself, in rank order).
MPI_Datatype mpi_transport_type(DType dtype);

// ceil-free split of n elements into `parts` slices: slice s is [offset(s), offset(s + 1)).
inline std::int64_t slice_offset(std::int64_t n, int parts, int s) {
  return n / parts * s + std::min<std::int64_t>(s, n % parts);
}

}  // namespace kiln::detail
