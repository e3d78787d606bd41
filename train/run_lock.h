#pragma once
// One training run per directory. `kiln train` locks each directory it writes to (logging.dir,
// checkpoint.dir) with a POSIX record lock (fcntl F_SETLK) on DIR/.kiln-lock, so a second run
// on the same directory refuses to start instead of overwriting the first one's checkpoints and
// interleaving its metrics.jsonl. The kernel (or NFS's lock manager) drops the lock when the
// holder dies, so a crashed run leaves nothing stuck; the file stays, with the last holder's host,
// pid and start time in it for the message.
//
// fcntl locks belong to the process, and closing any descriptor of the file drops them: keep one
// RunLock per file alive for the whole run, never two.

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kiln::train {

class RunLock {
 public:
  // Creates `dir` if missing, locks dir/.kiln-lock and writes this process's host, pid and start
  // time into it. Another process holding it: InputError naming `setting`, the directory and the
  // holder. A failing call: Error naming the file.
  RunLock(const std::string& dir, const std::string& setting);
  ~RunLock();  // closes the file, which releases the lock
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// What a run directory is (docs/training.md, "The run directory"): one run's metrics.jsonl and
// checkpoints. A fresh run (no checkpoint.resume, no --resume) in a logging.dir that already holds
// a metrics.jsonl, or a checkpoint.dir that holds step-N checkpoints, would truncate the first's
// metrics and, ranked by step, prune its own new checkpoints in favour of the old run's: refused
// with InputError naming the directory, --resume latest and a new directory. Call under the lock.
void require_unused_run_directories(const std::string& logging_dir,
                                    const std::string& checkpoint_dir);

// Locks each distinct directory of `dirs` ((setting, directory) pairs) once, in order: a
// checkpoint.dir equal to logging.dir is locked once.
std::vector<std::unique_ptr<RunLock>> lock_run_directories(
    const std::vector<std::pair<std::string, std::string>>& dirs);

}  // namespace kiln::train
