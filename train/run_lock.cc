#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>

#include "core/check.h"
#include "train/checkpoint.h"

namespace kiln::train {
namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown host";
  return name;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  char buf[32] = {};
  if (::gmtime_r(&now, &tm) == nullptr || std::strftime(buf, sizeof(buf), "%FT%TZ", &tm) == 0) {
    return "unknown time";
  }
  return buf;
}

// "host NAME, pid N, started T" from the file's "key=value" lines; the lock's own pid (F_GETLK)
// when the holder has not written them yet.
std::string describe_holder(int fd, const std::string& path) {
  std::string text;
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof(buf), 0);
  if (n > 0) text.assign(buf, static_cast<std::size_t>(n));
  std::string host, pid, started;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "host") host = value;
    if (key == "pid") pid = value;
    if (key == "started") started = value;
  }
  if (!host.empty() && !pid.empty()) {
    return "host " + host + ", pid " + pid + (started.empty() ? "" : ", started " + started);
  }
  struct flock query {};
  query.l_type = F_WRLCK;
  query.l_whence = SEEK_SET;
  if (::fcntl(fd, F_GETLK, &query) == 0 && query.l_type != F_UNLCK) {
    return "pid " + std::to_string(query.l_pid) + " (" + path + " names no holder yet)";
  }
  return "holder unknown (" + path + " names none yet)";
}

}  // namespace

RunLock::RunLock(const std::string& dir, const std::string& setting) : path_(dir + "/.kiln-lock") {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("cannot create " + setting + " " + dir + ": " + ec.message());
  // O_NOFOLLOW: a link planted at the lock's name must not make Kiln write the file it names.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0 && errno == ELOOP) {
    throw InputError("the run lock " + path_ +
                     " is a symbolic link; Kiln does not write through "
                     "links: remove it, or give this run its own directory (--set " +
                     setting + "=...)");
  }
  if (fd_ < 0) throw Error("cannot open the run lock " + path_ + ": " + std::strerror(errno));
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;  // l_start = l_len = 0: the whole file
  if (::fcntl(fd_, F_SETLK, &lock) != 0) {
    const int error = errno;
    std::string message;
    if (error == EACCES || error == EAGAIN) {
      message = setting + " " + dir + " is in use by another kiln train run (" +
                describe_holder(fd_, path_) + "; its lock " + path_ +
                "). Two runs on one directory would overwrite each other's checkpoints and "
                "metrics: wait for it to end, stop it, or give this run its own directory (--set " +
                setting + "=...)";
    } else {
      message =
          "cannot lock " + path_ + " (fcntl F_SETLK): " + std::strerror(error) +
          (error == ENOLCK ? " (on NFS the lock manager, lockd or NFSv4, must be running)" : "");
    }
    ::close(fd_);
    fd_ = -1;
    if (error == EACCES || error == EAGAIN) throw InputError(message);
    throw Error(message);
  }
  const std::string text = "host=" + host_name() + "\npid=" + std::to_string(::getpid()) +
                           "\nstarted=" + utc_now() + "\n";
  // Through this descriptor only: closing another one of the same file would drop the lock.
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int error = errno;
    ::close(fd_);
    fd_ = -1;
    throw Error("cannot write the run lock " + path_ + ": " + std::strerror(error));
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // a failing close still releases the lock: nothing to report
}

void require_unused_run_directories(const std::string& logging_dir,
                                    const std::string& checkpoint_dir) {
  auto refuse = [](const std::string& setting, const std::string& dir, const std::string& found) {
    throw InputError(setting + " " + dir + " already holds another run's " + found +
                     ": a fresh run there would mix with or destroy them. Continue that run "
                     "with --resume latest (or checkpoint.resume: latest in the config), or give "
                     "this run a new directory (--set " +
                     setting + "=...)");
  };
  struct stat st {};
  if (!logging_dir.empty() && ::lstat((logging_dir + "/metrics.jsonl").c_str(), &st) == 0) {
    refuse("logging.dir", logging_dir, "metrics (metrics.jsonl)");
  }
  std::error_code ec;
  if (checkpoint_dir.empty() || !std::filesystem::is_directory(checkpoint_dir, ec)) return;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoint_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (checkpoint_step(name))
      refuse("checkpoint.dir", checkpoint_dir, "checkpoints (" + name + ")");
  }
}

std::vector<std::unique_ptr<RunLock>> lock_run_directories(
    const std::vector<std::pair<std::string, std::string>>& dirs) {
  std::vector<std::unique_ptr<RunLock>> locks;
  std::vector<std::filesystem::path> locked;
  for (const auto& [setting, dir] : dirs) {
    if (dir.empty()) continue;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error("cannot create " + setting + " " + dir + ": " + ec.message());
    const std::filesystem::path canonical = std::filesystem::canonical(dir, ec);
    if (ec) throw Error("cannot resolve " + setting + " " + dir + ": " + ec.message());
    bool seen = false;
    for (const auto& p : locked) seen = seen || p == canonical;
    if (seen) continue;
    locks.push_back(std::make_unique<RunLock>(dir, setting));
    locked.push_back(canonical);
  }
  return locks;
}

}  // namespace kiln::train
