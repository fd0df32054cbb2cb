/*!
 * \file tvmsched/policy.h
 * \brief The scheduling policies, in the engine: which queued requests of a stream launch now, at which compiled
 *        batch size, with which candidate-ID list (mechanism A's online half, docs/runtime.md). Policies decide; they
 *        never touch a device: they see the model's candidates, its queued requests and the resource monitor.
 *
 *   colocation  FineCo's layer scheduler: the least co-located time against the other streams (ColocationTable)
 *   fastest     the fastest candidate of every layer, streams run concurrently
 *   partition   each model's fastest candidates within an even share of the units
 *   fcfs        fastest candidates, one request at a time in arrival order (serial(): the time-sharing baseline)
 *
 * Every policy here matches the Python one it replaces decision for decision, floats bit for bit: the recorded
 * decisions under tests/data/golden/ are replayed through both (tests/runtime/test_policy_golden.py).
 * Not thread-safe: its caller decides under one lock.
 */
#ifndef TVMSCHED_POLICY_H_
#define TVMSCHED_POLICY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tvmsched {

/*! \brief What a policy knows of one candidate kernel of one layer. */
struct CandidateInfo {
  double latency_us = 0;  ///< isolated latency
  int units = 0;          ///< compute units it runs on (the device's all-unit count for full-unit candidates)
  int key = -1;           ///< its profile key ("<model>/<kernel symbol>") interned by ColocationTable::Key
};

/*! \brief Every layer's candidates in one array, layer after layer: `layers[i][c]` is candidate c of layer i, and
 *  `index(i, c)` its place in the array (for tables kept beside it). A decision walks the layers in order, so their
 *  candidates come from memory in order, not from an allocation per layer (a decision's tail is its cache misses). */
class LayerCandidates {
 public:
  template <typename T>
  struct Range {  ///< one layer's candidates
    T* first = nullptr;
    T* last = nullptr;
    T* begin() const { return first; }
    T* end() const { return last; }
    size_t size() const { return static_cast<size_t>(last - first); }
    bool empty() const { return first == last; }
    T& operator[](size_t c) const { return first[c]; }
  };
  class Iterator {
   public:
    Iterator(const LayerCandidates* of, size_t i) : of_(of), i_(i) {}
    Range<const CandidateInfo> operator*() const { return (*of_)[i_]; }
    Iterator& operator++() { return ++i_, *this; }
    bool operator!=(const Iterator& other) const { return i_ != other.i_; }

   private:
    const LayerCandidates* of_;
    size_t i_;
  };

  LayerCandidates() = default;
  explicit LayerCandidates(const std::vector<std::vector<CandidateInfo>>& layers);
  size_t size() const { return starts_.size() - 1; }
  bool empty() const { return size() == 0; }
  size_t index(size_t i, int c) const { return starts_[i] + c; }
  size_t total() const { return all_.size(); }  ///< candidates of every layer
  Range<CandidateInfo> operator[](size_t i) { return {all_.data() + starts_[i], all_.data() + starts_[i + 1]}; }
  Range<const CandidateInfo> operator[](size_t i) const {
    return {all_.data() + starts_[i], all_.data() + starts_[i + 1]};
  }
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, size()}; }

 private:
  std::vector<CandidateInfo> all_;
  std::vector<size_t> starts_{0};  // layer i: all_[starts_[i], starts_[i + 1])
};

/*! \brief What the monitor knows of a busy stream: its remaining layers' chosen candidates, in order (a partly done
 *  layer with the share of its latency its remaining blocks stand for). */
struct StreamView {
  std::string name;
  std::vector<CandidateInfo> remaining;
};

/*! \brief Interference per unit time of candidate pairs (`tvmsched profile-coloc`). Lookup: the profiled pair; else
 *  the mean of the profiled pairs with the same unit counts (over the candidates it was told of); else the units'
 *  oversubscription max(0, units(a) + units(b) - all) / (units(a) + units(b)). */
class ColocationTable {
 public:
  explicit ColocationTable(int total_units) : total_units_(total_units) {}
  int total_units() const { return total_units_; }
  /*! \brief The id of a profile key (a new one the first time). */
  int Key(const std::string& key);
  /*! \brief A profiled pair's interference (a pair given again keeps its first place and takes the new value). */
  struct Measured {
    std::string first, second;
    double overhead;
  };
  /*! \brief A profile's pairs, in order (the means by unit counts are rebuilt once, after all of them). */
  void AddMeasured(const std::vector<Measured>& pairs);
  /*! \brief A loaded model's candidates (their keys and units): the unit counts the profiled pairs are averaged by. */
  void AddCandidates(const struct PolicyModel& model);
  double Overhead(const CandidateInfo& a, const CandidateInfo& b) const;
  double Fallback(const CandidateInfo& a, const CandidateInfo& b) const;
  /*! \brief Estimated time of `cand` while the `running` candidates run beside it throughout:
   *  latency / (1 - min(sum of interference, 0.99)). */
  double ColocatedUs(const CandidateInfo& cand, const std::vector<const CandidateInfo*>& running) const;

 private:
  static uint64_t Pair(int a, int b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void RebuildByUnits();
  double LookUp(const CandidateInfo& a, const CandidateInfo& b) const;  // Overhead from the maps
  /*! \brief Every pair of keys with known units resolved as Overhead resolves it, into one dense matrix: a decision
   *  reads one entry per pair, not two or three hash lookups (a decision's tail is its cache misses). */
  void Resolve();
  static constexpr int kMaxResolvedKeys = 1024;  // (8 MiB; more keys: Overhead looks pairs up as before)
  int total_units_;
  std::unordered_map<std::string, int> keys_;
  std::vector<uint64_t> order_;                    // profiled pairs, in the order first given
  std::unordered_map<uint64_t, double> measured_;  // pair of keys -> interference
  std::unordered_map<int, int> units_of_;          // key -> units
  std::unordered_map<uint64_t, double> by_units_;  // pair of unit counts -> mean interference
  int resolved_keys_ = 0;                          // keys [0, resolved_keys_) are in resolved_ (0: none)
  std::vector<int> resolved_units_;                // per key, the units it was resolved at (-1: unknown)
  std::vector<double> resolved_;  // resolved_keys_ x resolved_keys_: Overhead of (first, second) at [first][second]
};

/*! \brief A model as its policy sees it (built once at load). */
struct PolicyModel {
  std::string name;
  LayerCandidates layers;    ///< layers[i][c]: candidate c of layer i
  double qos_ms = -1;        ///< its latency target (< 0: none)
  std::vector<int> fastest;  ///< the fastest candidate of every layer
  bool choice = false;       ///< some layer has more than one candidate
  /*! \brief The layer scheduler's time for the fastest candidates, kept from the first decision that computed it
   *  (< 0: none yet; as the Python scheduler kept it, bit for bit). Kept here, per model and per batch size, not by
   *  the model's name: a model's sizes share the name, and a model loaded again under it has candidates of its own. */
  mutable double kept_fastest_us = -1;
};

/*! \brief A model's view from its layers (`fastest` and `choice` derived from them). */
PolicyModel MakePolicyModel(std::string name, std::vector<std::vector<CandidateInfo>> layers, double qos_ms);

/*! \brief A request waiting in a stream's queue, as a policy sees it. */
struct QueuedRequest {
  int64_t rows = 1;        ///< its batch rows
  double arrival_us = 0;   ///< when it was submitted (Device::NowMicros)
  double timeout_us = 0;   ///< the longest it may stay queued (0: none)
  double deadline_us = 0;  ///< its latency target's end: arrival + qos (0: none)
  int priority = 0;        ///< 1: real-time, 0: best-effort
};

/*! \brief What a policy is asked: may this stream launch, and what. */
struct PolicyInput {
  const PolicyModel* model = nullptr;
  std::string stream;  ///< the monitor's name of the stream (a model on several streams: which one)
  const std::vector<QueuedRequest>* queued = nullptr;  ///< the stream's queued requests, oldest first
  /*! \brief Every stream's work still to run, read on demand (the policy's own stream included; an idle stream's
   *  is empty). The answer stays valid for the decision. */
  std::function<const std::vector<StreamView>&()> monitor;
  int total_units = 1;
  int loaded_models = 1;
};

/*! \brief A policy's answer. Today's policies launch the oldest queued request alone (batch 1). */
struct PolicyDecision {
  std::vector<int> launch;         ///< indices into PolicyInput::queued, to launch together (empty: none now)
  int batch = 1;                   ///< the compiled batch size to run them at
  std::vector<int> candidate_ids;  ///< one per layer
  // the colocation policy's estimate (the others leave these)
  double estimated_ms = 0;
  bool meets_qos = true;
  int streams = 0;     ///< other streams busy when it was decided
  double seconds = 0;  ///< time the decision took, the monitor's read included
  bool estimated = false;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual const char* kind() const = 0;
  /*! \brief Requests run one at a time across every model (the fcfs baseline). */
  virtual bool serial() const { return false; }
  virtual PolicyDecision Decide(const PolicyInput& input) = 0;
};

/*! \brief The layer scheduler: greedy over the layers in order, each layer's candidate with the least co-located time
 *  against what every other stream runs at that moment (their remaining layers laid out in time). */
class LayerScheduler {
 public:
  explicit LayerScheduler(std::shared_ptr<ColocationTable> table) : table_(std::move(table)) {}
  ColocationTable& table() { return *table_; }
  /*! \brief The candidate-ID list of a request of `model` starting in `start_us` (its own stream's earlier work
   *  first), against `others` (streams with nothing left are skipped). */
  PolicyDecision Choose(const PolicyModel& model, const std::vector<const StreamView*>& others, double start_us);
  /*! \brief Decisions taken, and the latest ones' times (µs; up to kHistory). */
  int64_t decided() const { return decided_; }
  const std::deque<double>& decision_us() const { return decision_us_; }
  /*! \brief Of each of those, the time spent reading the monitor (every stream's state). */
  const std::deque<double>& monitor_us() const { return monitor_us_; }
  /*! \brief Of each of those, the CPU time its thread ran (µs, CLOCK_THREAD_CPUTIME_ID): a decision's time less this
   *  is the time its thread was off its core (descheduled, or waiting), not tvmsched's code. */
  const std::deque<double>& cpu_us() const { return cpu_us_; }
  void RecordTime(double us, double monitor_us, double cpu_us);
  static constexpr size_t kHistory = 10000;

 private:
  std::shared_ptr<ColocationTable> table_;
  int64_t decided_ = 0;
  std::deque<double> decision_us_, monitor_us_, cpu_us_;
  // Choose's scratch, kept between decisions: the busy streams, when each of their remaining layers ends, what runs
  // beside the layer being chosen, and where each stream is at that time
  std::vector<const StreamView*> busy_;
  std::vector<std::vector<double>> ends_;
  std::vector<const CandidateInfo*> running_;
  std::vector<size_t> at_;
};

/*! \brief A policy by kind ("colocation", "fastest", "partition", "fcfs"); `table`: colocation's profile (null: the
 *  fallback rule for every pair). One-line TvmschedError for an unknown kind. */
std::unique_ptr<Policy> CreatePolicy(const std::string& kind, std::shared_ptr<ColocationTable> table, int total_units);

/*! \brief The fastest candidate of every layer (the first of equals). */
std::vector<int> FastestIds(const LayerCandidates& layers);

/*! \brief The colocation policy's layer scheduler (null for the other kinds). */
LayerScheduler* SchedulerOf(Policy& policy);

}  // namespace tvmsched

#endif  // TVMSCHED_POLICY_H_
