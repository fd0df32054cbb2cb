#include "tvmsched/policy.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>

namespace tvmsched {

namespace {

constexpr double kMaxOverhead = 0.99;  // interference per unit time is capped below 1 (which would never finish)

double NowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/*! \brief The calling thread's CPU time (µs). */
double ThreadCpuUs() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

}  // namespace

// ---- the colocation table ------------------------------------------------------------------

int ColocationTable::Key(const std::string& key) {
  auto [at, added] = keys_.emplace(key, static_cast<int>(keys_.size()));
  return at->second;
}

void ColocationTable::AddMeasured(const std::vector<Measured>& pairs) {
  for (const Measured& m : pairs) {
    uint64_t pair = Pair(Key(m.first), Key(m.second));
    if (measured_.emplace(pair, m.overhead).second) {
      order_.push_back(pair);
    } else {
      measured_[pair] = m.overhead;
    }
  }
  RebuildByUnits();    // (once: per pair it made loading a profile of P pairs O(P^2))
  resolved_keys_ = 0;  // (resolved again when candidates are added: a table is measured before models load)
}

void ColocationTable::AddCandidates(const PolicyModel& model) {
  for (const auto& cands : model.layers) {
    for (const CandidateInfo& c : cands) units_of_[c.key] = c.units;
  }
  RebuildByUnits();
  Resolve();
}

void ColocationTable::Resolve() {
  resolved_keys_ = 0;
  const int n = static_cast<int>(keys_.size());
  if (n > kMaxResolvedKeys) return;
  resolved_units_.assign(n, -1);
  for (const auto& [key, units] : units_of_) {
    if (key >= 0 && key < n) resolved_units_[key] = units;
  }
  resolved_.assign(static_cast<size_t>(n) * n, 0.0);
  CandidateInfo a, b;
  for (a.key = 0; a.key < n; ++a.key) {
    if ((a.units = resolved_units_[a.key]) < 0) continue;
    for (b.key = 0; b.key < n; ++b.key) {
      if ((b.units = resolved_units_[b.key]) < 0) continue;
      resolved_[static_cast<size_t>(a.key) * n + b.key] = LookUp(a, b);
    }
  }
  resolved_keys_ = n;
}

void ColocationTable::RebuildByUnits() {
  // the mean per (units of the first, units of the second), the values summed in the order the pairs were profiled
  std::map<uint64_t, std::pair<double, int>> groups;
  for (uint64_t pair : order_) {
    auto first = units_of_.find(static_cast<int>(pair >> 32));
    auto second = units_of_.find(static_cast<int>(pair & 0xffffffffu));
    if (first == units_of_.end() || second == units_of_.end()) continue;
    auto& [sum, count] = groups[Pair(first->second, second->second)];
    sum += measured_.at(pair);
    ++count;
  }
  by_units_.clear();
  for (const auto& [units, sum_count] : groups) by_units_[units] = sum_count.first / sum_count.second;
}

double ColocationTable::Fallback(const CandidateInfo& a, const CandidateInfo& b) const {
  int demand = a.units + b.units;
  return std::max(0.0, static_cast<double>(demand - total_units_) / demand);
}

double ColocationTable::Overhead(const CandidateInfo& a, const CandidateInfo& b) const {
  const int n = resolved_keys_;
  if (a.key >= 0 && b.key >= 0 && a.key < n && b.key < n && resolved_units_[a.key] == a.units &&
      resolved_units_[b.key] == b.units) {
    return resolved_[static_cast<size_t>(a.key) * n + b.key];
  }
  return LookUp(a, b);
}

double ColocationTable::LookUp(const CandidateInfo& a, const CandidateInfo& b) const {
  if (!measured_.empty()) {
    auto found = measured_.find(Pair(a.key, b.key));
    if (found != measured_.end()) return found->second;
    auto mean = by_units_.find(Pair(a.units, b.units));
    if (mean != by_units_.end()) return mean->second;
  }
  return Fallback(a, b);
}

double ColocationTable::ColocatedUs(const CandidateInfo& cand, const std::vector<const CandidateInfo*>& running) const {
  double rate = 0;
  for (const CandidateInfo* other : running) rate += Overhead(cand, *other);
  return cand.latency_us / (1 - std::min(rate, kMaxOverhead));
}

// ---- the layer scheduler ---------------------------------------------------------------------

LayerCandidates::LayerCandidates(const std::vector<std::vector<CandidateInfo>>& layers) {
  for (const auto& cands : layers) {
    all_.insert(all_.end(), cands.begin(), cands.end());
    starts_.push_back(all_.size());
  }
}

namespace {

template <typename Cands>
int Fastest(const Cands& cands) {
  int best = 0;
  for (int c = 1; c < static_cast<int>(cands.size()); ++c) {
    if (cands[c].latency_us < cands[best].latency_us) best = c;
  }
  return best;
}

}  // namespace

std::vector<int> FastestIds(const LayerCandidates& layers) {
  std::vector<int> ids;
  ids.reserve(layers.size());
  for (const auto& cands : layers) ids.push_back(Fastest(cands));
  return ids;
}

PolicyModel MakePolicyModel(std::string name, std::vector<std::vector<CandidateInfo>> layers, double qos_ms) {
  PolicyModel model;
  model.name = std::move(name);
  model.qos_ms = qos_ms;
  model.choice = std::any_of(layers.begin(), layers.end(), [](const auto& cands) { return cands.size() > 1; });
  model.layers = LayerCandidates(layers);
  model.fastest = FastestIds(model.layers);
  return model;
}

void LayerScheduler::RecordTime(double us, double monitor_us, double cpu_us) {
  if (decision_us_.size() >= kHistory) decision_us_.pop_front(), monitor_us_.pop_front(), cpu_us_.pop_front();
  decision_us_.push_back(us);
  monitor_us_.push_back(monitor_us);
  cpu_us_.push_back(cpu_us);
}

PolicyDecision LayerScheduler::Choose(const PolicyModel& model, const std::vector<const StreamView*>& all_others,
                                      double start_us) {
  PolicyDecision decision;
  std::vector<const StreamView*>& others = busy_;  // (the scratch buffers keep their memory between decisions)
  others.clear();
  for (const StreamView* view : all_others) {
    if (!view->remaining.empty()) others.push_back(view);
  }
  double estimate_us = 0;
  if (others.empty()) {  // nobody else runs: the fastest candidate of every layer
    const bool kept = !model.fastest.empty();
    decision.candidate_ids = kept ? model.fastest : FastestIds(model.layers);
    if (kept && model.kept_fastest_us >= 0) {
      estimate_us = start_us + model.kept_fastest_us;
    } else {
      double sum = 0;
      for (size_t i = 0; i < model.layers.size(); ++i) sum += model.layers[i][decision.candidate_ids[i]].latency_us;
      estimate_us = start_us + sum;
      if (kept) model.kept_fastest_us = estimate_us - start_us;  // (as the Python scheduler kept it: bit for bit)
    }
  } else {
    // each other stream's remaining layers laid out in time: the end of each
    std::vector<std::vector<double>>& ends = ends_;
    if (ends.size() < others.size()) ends.resize(others.size());
    for (size_t s = 0; s < others.size(); ++s) {
      double t = 0;
      ends[s].clear();
      for (const CandidateInfo& c : others[s]->remaining) ends[s].push_back(t += c.latency_us);
    }
    std::vector<const CandidateInfo*>& running = running_;
    std::vector<size_t>& at = at_;  // per stream, its first layer ending after `now` (`now` only grows)
    at.assign(others.size(), 0);
    double now = start_us;
    decision.candidate_ids.reserve(model.layers.size());
    for (const auto& cands : model.layers) {
      running.clear();
      for (size_t s = 0; s < others.size(); ++s) {  // what each runs at `now` (none once it has finished)
        while (at[s] < ends[s].size() && ends[s][at[s]] <= now) ++at[s];
        if (at[s] < ends[s].size()) running.push_back(&others[s]->remaining[at[s]]);
      }
      int best = 0;
      double best_cost = 0;
      for (int c = 0; c < static_cast<int>(cands.size()); ++c) {
        double cost = table_->ColocatedUs(cands[c], running);
        if (c == 0 || cost < best_cost) best = c, best_cost = cost;
      }
      decision.candidate_ids.push_back(best);
      now += best_cost;
    }
    estimate_us = now;
  }
  decision.estimated = true;
  decision.estimated_ms = estimate_us / 1e3;
  decision.meets_qos = model.qos_ms < 0 || estimate_us <= model.qos_ms * 1e3;
  decision.streams = static_cast<int>(others.size());
  ++decided_;
  return decision;
}

// ---- the policies ----------------------------------------------------------------------------

namespace {

/*! \brief Today's policies: the oldest queued request alone, at batch size 1. */
PolicyDecision OldestAlone(const PolicyInput& input, std::vector<int> ids) {
  PolicyDecision decision;
  if (input.queued == nullptr || !input.queued->empty()) decision.launch = {0};
  decision.candidate_ids = std::move(ids);
  return decision;
}

class FastestPolicy : public Policy {
 public:
  const char* kind() const override { return "fastest"; }
  PolicyDecision Decide(const PolicyInput& input) override {
    const PolicyModel& m = *input.model;
    return OldestAlone(input, m.fastest.empty() ? FastestIds(m.layers) : m.fastest);
  }
};

class FcfsPolicy : public FastestPolicy {
 public:
  const char* kind() const override { return "fcfs"; }
  bool serial() const override { return true; }
};

class PartitionPolicy : public Policy {
 public:
  const char* kind() const override { return "partition"; }
  PolicyDecision Decide(const PolicyInput& input) override {
    // (not cached by the model's name: a model's batch sizes share it, and each size has candidates of its own)
    int share = std::max(1, input.total_units / std::max(1, input.loaded_models));
    return OldestAlone(input, Within(input.model->layers, share));
  }

 private:
  static std::vector<int> Within(const LayerCandidates& layers, int share) {
    std::vector<int> ids;
    for (const auto& cands : layers) {
      int best = -1;
      for (int c = 0; c < static_cast<int>(cands.size()); ++c) {  // the fastest that fits (any, when none fits)
        if (cands[c].units <= share && (best < 0 || cands[c].latency_us < cands[best].latency_us)) best = c;
      }
      if (best < 0) best = Fastest(cands);
      ids.push_back(best);
    }
    return ids;
  }
};

class ColocationPolicy : public Policy {
 public:
  explicit ColocationPolicy(std::shared_ptr<ColocationTable> table) : scheduler_(std::move(table)) {}
  const char* kind() const override { return "colocation"; }
  LayerScheduler& scheduler() { return scheduler_; }

  PolicyDecision Decide(const PolicyInput& input) override {
    const PolicyModel& m = *input.model;
    if (!m.choice) {  // one candidate per layer: nothing to decide, so no monitor to read
      return OldestAlone(input, m.fastest.empty() ? FastestIds(m.layers) : m.fastest);
    }
    const double cpu_start = ThreadCpuUs();  // (read outside the wall-clock window: its own cost is not counted)
    double start = NowUs();
    static const std::vector<StreamView> kNoViews;
    const std::vector<StreamView>& views = input.monitor ? input.monitor() : kNoViews;
    double monitor_us = NowUs() - start;
    // it starts when its own stream's earlier work is done; the model's other streams run beside it like any other
    double start_us = 0;
    std::vector<const StreamView*>& others = others_;
    others.clear();
    bool own_found = false;
    for (const StreamView& view : views) {
      if (!own_found && view.name == input.stream) {
        own_found = true;
        for (const CandidateInfo& c : view.remaining) start_us += c.latency_us;
      } else {
        others.push_back(&view);
      }
    }
    PolicyDecision decision = scheduler_.Choose(m, others, start_us);
    if (input.queued == nullptr || !input.queued->empty()) decision.launch = {0};
    decision.seconds = (NowUs() - start) / 1e6;
    scheduler_.RecordTime(decision.seconds * 1e6, monitor_us, ThreadCpuUs() - cpu_start);
    return decision;
  }

 private:
  LayerScheduler scheduler_;
  std::vector<const StreamView*> others_;  // Decide's scratch
};

}  // namespace

std::unique_ptr<Policy> CreatePolicy(const std::string& kind, std::shared_ptr<ColocationTable> table, int total_units) {
  if (kind == "colocation") {
    return std::make_unique<ColocationPolicy>(table ? std::move(table)
                                                    : std::make_shared<ColocationTable>(total_units));
  }
  if (kind == "fastest") return std::make_unique<FastestPolicy>();
  if (kind == "partition") return std::make_unique<PartitionPolicy>();
  if (kind == "fcfs") return std::make_unique<FcfsPolicy>();
  TVM_FFI_THROW(TvmschedError) << "policy must be one of ('colocation', 'fastest', 'partition', 'fcfs'), not '" << kind
                               << "'";
  return nullptr;  // not reached
}

LayerScheduler* SchedulerOf(Policy& policy) {
  auto* colocation = dynamic_cast<ColocationPolicy*>(&policy);
  return colocation ? &colocation->scheduler() : nullptr;
}

}  // namespace tvmsched
