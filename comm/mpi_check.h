#pragma once
// KILN_MPI_CHECK: a failed MPI call becomes a kiln::Error naming MPI's own error string, the
// call, its location and this rank. Communicators set MPI_ERRORS_RETURN so errors reach it
// instead of MPI's default abort.

#include <mpi.h>

#include <string>

#include "core/check.h"

namespace kiln {

std::string mpi_error_string(int code);  // MPI_Error_string plus the error class
std::string mpi_error_hint(int code);    // what to check, or ""

}  // namespace kiln

#define KILN_MPI_CHECK(expr)                                                                      \
  do {                                                                                            \
    int kiln_mpi_status_ = (expr);                                                                \
    if (kiln_mpi_status_ != MPI_SUCCESS) {                                                        \
      ::kiln::report_failure("MPI", ::kiln::mpi_error_string(kiln_mpi_status_), KILN_SITE(#expr), \
                             ::kiln::mpi_error_hint(kiln_mpi_status_));                           \
    }                                                                                             \
  } while (0)
