#pragma once
// The report rank 0 prints: one JSON object (--json) or a table of ranks and checks, each with
// the overall verdict.

#include <string>
#include <vector>

#include "launch/doctor/checks.h"
#include "launch/doctor/facts.h"

namespace kiln::launch::doctor {

// The worst verdict of the checks.
Verdict overall_verdict(const std::vector<Check>& checks);

// `device` is where the collectives ran: "cuda" or "cpu".
void print_json(const std::vector<Check>& checks, const std::vector<RankFacts>& ranks,
                const std::string& device);
void print_table(const std::vector<Check>& checks, const std::vector<RankFacts>& ranks,
                 const std::string& device);

}  // namespace kiln::launch::doctor
