#pragma once
// What a path is, checked before Kiln reads it: a user who points a weights, data, config or
// checkpoint path at /dev/zero, a FIFO or a directory gets a message saying so, not an endless
// read or a misleading "truncated file".

#include <string>

namespace kiln {

// "a regular file", "a directory", "a character device", "a FIFO", "a socket",
// "a block device", "a broken symbolic link", "nothing (no such file or directory)".
std::string describe_file_kind(const std::string& path);

// Throws InputError "<path>: <what> must be a regular file, but it is <kind>" unless `path`
// (after following symbolic links) is a regular file; "<path>: cannot open <what>: nothing (no
// such file or directory)" when there is nothing there. `what` names the role: "a data file".
void require_regular_file(const std::string& path, const std::string& what);

// Reads the whole of `path`, which must be a regular file: the one way Kiln reads a file whole.
// The path is checked before it is opened (opening a FIFO without a writer blocks; /dev/zero never
// ends), opened with O_NONBLOCK and checked again on the descriptor, so a FIFO or device swapped
// in between is refused too. InputError as require_regular_file's, or naming the failing call.
std::string read_regular_file(const std::string& path, const std::string& what);

// The same for a directory.
void require_directory(const std::string& path, const std::string& what);

// Before Kiln writes `path` by renaming a new file over it: InputError unless the path is
// non-empty and holds nothing or a regular file (after following links), so a device node
// (/dev/null), a FIFO or a directory is never replaced. `what` names the role: "--onnx".
void require_replaceable_file(const std::string& path, const std::string& what);

}  // namespace kiln
