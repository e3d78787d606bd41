#pragma once
// Checkpoints are directories (step-000500/) written under a temporary name and renamed when
// complete: model.safetensors (parameters and buffers under PyTorch's names, so PyTorch reads
// them), optimizer.safetensors (moments, master weights), state.pbtxt (CheckpointState: step,
// data position, loss scale, seed, the experiment), with PowerSGD compression.safetensors (each
// rank's error feedback and Q, named "rank<r>.<name>"), and MANIFEST (size and CRC-32 of each
// file, and of itself). A directory is either complete and verified, or never loaded.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "configs/checkpoint.pb.h"
#include "core/safetensors.h"

namespace kiln::train {

struct Checkpoint {
  std::string path;
  SafetensorsFile model;
  SafetensorsFile optimizer;
  config::CheckpointState state;
  std::optional<SafetensorsFile> compression;  // when the run compressed with PowerSGD
};

class CheckpointStore {
 public:
  CheckpointStore(std::string dir, int keep_last);

  // Writes a complete checkpoint for `state.step()` and returns its directory; then removes all
  // but the newest keep_last. Throws Error (naming the file; a full disk says so) and leaves no
  // partial directory under a final name.
  // `compression` (every rank's PowerSGD state) is written only when non-empty.
  std::string save(const NamedTensors& model, const NamedTensors& optimizer,
                   const config::CheckpointState& state, const NamedTensors& compression = {});

  // Complete checkpoint directories, oldest first (partial ones are ignored).
  std::vector<std::string> list() const;
  std::optional<std::string> latest() const;
  // Removes leftovers of interrupted writes (temporary directories of dead processes).
  void remove_partial() const;

  // Verifies the manifest and every file, then reads them; InputError naming the file and the
  // reason (missing, size or checksum mismatch, unparsable state).
  static Checkpoint load(const std::string& path);

  const std::string& dir() const { return dir_; }

 private:
  void prune() const;
  std::string dir_;
  int keep_last_;
};

std::string checkpoint_name(std::int64_t step);  // "step-000500"

}  // namespace kiln::train
