#pragma once
// The process-wide cache of cuDNN execution plans that layers/cuda/conv2d_graph.cc and
// layers/cuda/conv_bn_fusion.cc keep: one plan per key (device, geometry, options), built on
// first use and kept for the process's life, so a layer call only binds pointers and runs.
// Building runs outside the lock: choosing an engine can take seconds in benchmark mode and other
// layers' calls must not wait on it. When two threads build one key, the first to insert wins.

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

template <typename Plan>
class PlanCache {
 public:
  struct Entry {
    std::size_t index;  // stable: at(index) returns `plan` for the cache's life
    Plan* plan;         // null where the builder found none usable
  };

  // The plan under `key`. On a miss, build() (a std::unique_ptr<Plan>, null for none usable) runs
  // unlocked; on_insert(Plan*) runs under the lock, once per key, for the plan that is kept.
  template <typename Build, typename OnInsert>
  Entry find_or_build(const std::string& key, Build&& build, OnInsert&& on_insert) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = index_.find(key);
      if (it != index_.end()) return {it->second, plans_[it->second].get()};
    }
    std::unique_ptr<Plan> plan = build();
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, inserted] = index_.emplace(key, plans_.size());
    if (inserted) {
      plans_.push_back(std::move(plan));
      on_insert(plans_.back().get());
    }
    return {it->second, plans_[it->second].get()};
  }

  Plan* at(std::size_t index) {
    std::lock_guard<std::mutex> lock(mutex_);
    return plans_.at(index).get();
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::size_t> index_;  // key -> plans_ index
  std::vector<std::unique_ptr<Plan>> plans_;
};

}  // namespace kiln
