#pragma once
// Checkpoints are directories (step-000500/) written under a temporary name and renamed when
// complete: model.safetensors (parameters and buffers under PyTorch's names, so PyTorch reads
// them), optimizer.safetensors (moments, master weights), state.pbtxt (CheckpointState: step,
// data position, loss scale, seed, the experiment), with PowerSGD compression.safetensors (each
// rank's error feedback and Q, named "rank<r>.<name>"), and MANIFEST (size and CRC-32 of each
// file, and of itself). A directory is either complete and verified, or never loaded.
//
// A sharded run (parallel.zero_stage > 0) writes, instead of optimizer.safetensors, one
// optimizer-rank-RRRRR-of-WWWWW.safetensors per rank (its pieces; the safetensors metadata gives
// the ranges), each rank into the same staging directory (staging_dir()) before rank 0 completes
// the checkpoint and renames it; the manifest lists every shard file.

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
  SafetensorsFile optimizer;                      // empty in a sharded checkpoint
  std::vector<SafetensorsFile> optimizer_shards;  // by rank; empty in an unsharded one
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
  // Sharded: the shard files (names in the directory) were written into staging_dir(step) by
  // every rank; this writes the rest there, the manifest, and renames it (rank 0).
  std::string save_sharded(const NamedTensors& model, const std::vector<std::string>& shard_files,
                           const config::CheckpointState& state,
                           const NamedTensors& compression = {});
  // The directory every rank of a sharded save writes its shard into (created by
  // prepare_staging(), rank 0, before the others write).
  std::string staging_dir(std::int64_t step) const;
  void prepare_staging(std::int64_t step) const;

  // Complete checkpoint directories, oldest (lowest step number) first; partial ones are ignored.
  std::vector<std::string> list() const;
  std::optional<std::string> latest() const;
  // step-N directories without a MANIFEST (never written completely by Kiln: copied in part, or
  // their manifest deleted), oldest first. Never loaded, never pruned: resume names them.
  std::vector<std::string> unmanifested() const;
  // "latest" for a command that only reads (kiln sample, kiln export): latest(), and in *note
  // skipped_note() for the unmanifested directories it skips ("" when none).
  std::optional<std::string> latest_for_reading(const std::string& option, std::string* note) const;
  // "warning: OPTION latest skips N checkpoint directories in DIR: ... (no MANIFEST: ...)".
  static std::string skipped_note(const std::string& option, const std::string& dir,
                                  const std::vector<std::string>& skipped);
  // The skipped directories and why they are skipped: " a, b (no MANIFEST: ...)".
  static std::string skipped_list(const std::vector<std::string>& skipped);
  // Removes leftovers of interrupted writes (temporary directories of dead processes).
  void remove_partial() const;

  // Verifies the manifest and every file, then reads them; InputError naming the file and the
  // reason (missing, size or checksum mismatch, unparsable state).
  static Checkpoint load(const std::string& path);

  const std::string& dir() const { return dir_; }

 private:
  void prune() const;
  std::string complete(const std::string& tmp, const NamedTensors& model,
                       const NamedTensors* optimizer, std::vector<std::string> files,
                       const config::CheckpointState& state, const NamedTensors& compression);
  std::string dir_;
  int keep_last_;
};

std::string checkpoint_name(std::int64_t step);  // "step-000500"
// The step a checkpoint directory's name stands for ("step-1000000" -> 1000000); nullopt for any
// other name.
std::optional<std::int64_t> checkpoint_step(const std::string& name);
// "optimizer-rank-00001-of-00002.safetensors"
std::string optimizer_shard_name(int rank, int world_size);

}  // namespace kiln::train
