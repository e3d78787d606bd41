#include "core/file_kind.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace kiln {
namespace {

enum class Kind { kRegular, kDirectory, kOther };

Kind kind_of(const std::string& path, std::string& description) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const int error = errno;
    struct stat link {};
    if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      description = "a broken symbolic link";
    } else if (error == ENOENT || error == ENOTDIR) {
      description = "nothing (no such file or directory)";
    } else {
      description = std::string("not accessible (") + std::strerror(error) + ")";
    }
    return Kind::kOther;
  }
  if (S_ISREG(info.st_mode)) {
    description = "a regular file";
    return Kind::kRegular;
  }
  if (S_ISDIR(info.st_mode)) {
    description = "a directory";
    return Kind::kDirectory;
  }
  if (S_ISCHR(info.st_mode)) {
    description = "a character device";
  } else if (S_ISBLK(info.st_mode)) {
    description = "a block device";
  } else if (S_ISFIFO(info.st_mode)) {
    description = "a FIFO (named pipe)";
  } else if (S_ISSOCK(info.st_mode)) {
    description = "a socket";
  } else {
    description = "not a regular file";
  }
  return Kind::kOther;
}

}  // namespace

std::string describe_file_kind(const std::string& path) {
  std::string description;
  kind_of(path, description);
  return description;
}

namespace {

[[noreturn]] void refuse(const std::string& path, const std::string& what, const char* wanted,
                         const std::string& description) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    throw InputError(path + ": cannot open " + what + ": " + description);
  }
  throw InputError(path + ": " + what + " must be " + wanted + ", but it is " + description);
}

}  // namespace

void require_regular_file(const std::string& path, const std::string& what) {
  std::string description;
  if (kind_of(path, description) != Kind::kRegular) {
    refuse(path, what, "a regular file", description);
  }
}

void require_directory(const std::string& path, const std::string& what) {
  std::string description;
  if (kind_of(path, description) != Kind::kDirectory)
    refuse(path, what, "a directory", description);
}

void require_replaceable_file(const std::string& path, const std::string& what) {
  if (path.empty()) throw InputError(what + ": the output path is empty; name a file");
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return;  // nothing there (or a dangling link): created
  std::string description;
  if (kind_of(path, description) == Kind::kRegular) return;
  throw InputError(path + ": " + what + " would replace " + description +
                   "; Kiln writes only over regular files: name a new or regular file");
}

}  // namespace kiln
