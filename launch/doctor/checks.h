#pragma once
// The checks of `kiln doctor`, each a verdict (ok / warn / fail), a detail and a fix. The checks
// of the gathered facts are pure: a table of entries (name, whether it is about GPUs, body) that
// run_check evaluates, so each can be tested from made-up facts.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/json_writer.h"
#include "launch/doctor/facts.h"
#include "launch/doctor/options.h"

namespace kiln::launch::doctor {

enum class Verdict { Ok, Warn, Fail };

const char* verdict_name(Verdict verdict);

struct Check {
  explicit Check(std::string check_name) : name(std::move(check_name)) {}
  std::string name;
  Verdict verdict = Verdict::Ok;
  std::string detail;
  std::string fix;                        // "nothing to do" when a check finishes without one
  std::function<void(JsonWriter&)> data;  // extra JSON fields of the check

  void raise(Verdict v) { verdict = std::max(verdict, v); }
  void add_detail(const std::string& more) { append(detail, more); }
  void add_fix(const std::string& more) { append(fix, more); }

 private:
  static void append(std::string& text, const std::string& more) {
    text += (text.empty() ? "" : "; ") + more;
  }
};

// What the checks of facts read: every rank's facts, in rank order, and what this process knows.
struct JobFacts {
  std::vector<RankFacts> ranks;
  // This process's rank: the peer-access check reads NCCL_P2P_DISABLE as this process sees it.
  int self = 0;
  // The job runs on GPUs: --device allows them and every rank sees at least one.
  bool cuda = false;
};

// The job's facts from every rank's, `self` being this process's rank.
JobFacts job_facts(std::vector<RankFacts> ranks, int self, const DoctorOptions& options);

struct CheckEntry {
  const char* name;
  bool about_gpus;  // without GPUs the check says "no GPU" and does not run its body
  void (*body)(Check& check, const JobFacts& job, const DoctorOptions& options);
};

// The checks of facts in report order: world, peer_access, network, checkpoint_write,
// gpu_health. The collective checks (collective_checks.h) report after the first
// kChecksBeforeCollectives, since the world check decides where the collectives run.
const std::vector<CheckEntry>& fact_checks();
constexpr std::size_t kChecksBeforeCollectives = 2;
// The entry named `name`; an unknown name throws kiln::Error listing the known ones.
const CheckEntry& fact_check(const std::string& name);

// The prologue and epilogue every check shares: a Check named after the entry, "no GPU" for a
// check about GPUs on a job without them, "nothing to do" when the body found no fix.
Check run_check(const CheckEntry& entry, const JobFacts& job, const DoctorOptions& options);
// The epilogue alone, for the collective checks.
void finish_check(Check& check);

// The world check failing means the ranks do not have one GPU each: collectives then run on the
// CPU over MPI.
bool gpus_usable(const JobFacts& job, const Check& world);

// printf of one number, for messages ("%.0f" MB/s).
std::string format_number(const char* format, double value);

}  // namespace kiln::launch::doctor
