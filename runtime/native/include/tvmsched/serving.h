// What a server keeps of each model it serves and says about it, in one place for both servers (`tvmsched serve`,
// tvmsched/serve/service.py through tvmsched.engine.served_*; examples/cpp/server.cc): admission by queue cap, the
// counters of Triton's statistics extension and nv_inference_* metrics, and the JSON of a model's metadata, Triton's
// model configuration and statistics, written from the Runtime and those counters.
//
//   https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_statistics.md
//   https://github.com/triton-inference-server/server/blob/main/docs/user_guide/metrics.md
//
// Triton's meaning: `success` counts a request from when the server has read it (its body in) to its answer; `fail`
// the same for a request answered with an error (refused at admission included); queue, compute_input, compute_infer
// and compute_output count successful requests only (queue: submitted to started in the engine; compute_infer: started
// to finished; compute_input/output: the server's parsing and encoding). Times are monotonic nanoseconds
// (std::chrono::steady_clock; Python's time.monotonic_ns() is the same clock on Linux).
#ifndef TVMSCHED_SERVING_H_
#define TVMSCHED_SERVING_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tvmsched/kserve.h"
#include "tvmsched/runtime.h"

namespace tvmsched {
namespace serving {

/*! \brief Now, in the clock served models count in. */
int64_t NowNs();

/*! \brief How a loaded model is served (its config's keys beyond what the Runtime's ModelOptions take). */
struct ServedOptions {
  std::string name;            ///< the Runtime's name of the loaded model
  std::string version = "1";   ///< the version it answers to (a Triton-layout folder's)
  int64_t max_batch_size = 0;  ///< rows a request may bring (0: the compiled batch size; not batched: 0)
  int64_t max_queue = 64;      ///< requests admitted and not answered yet, at most (503 beyond)
  int64_t streams = 1;
  double max_queue_delay_us = 0;
  std::vector<int64_t> preferred_batch_sizes;
};

/*! \brief The upper bounds (seconds) of tvmsched_request_latency_seconds' buckets (the last: +Inf). */
inline constexpr double kLatencyBuckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                             0.1,    0.25,  0.5,    1,     2.5,  5,     10};

/*! \brief Triton's {"count", "ns"}. */
struct Duration {
  std::atomic<int64_t> count{0}, ns{0};
  void Add(int64_t n) { count += 1, ns += n; }
};

class ServedObj : public ffi::Object {
 public:
  /*! \brief Model `options.name`, loaded in `runtime`, as served: its tensors from the artifact's manifest (a batched
   *  model's leading dimension -1: any rows up to `batch`). */
  ServedObj(Runtime runtime, ServedOptions options);

  /*! \brief Admit a request: the requests pending before it, or -1 (nothing counted) when `max_queue` are. */
  int64_t Admit();
  /*! \brief An admitted request answered: `request` (what the Runtime ran; null: failed before it was submitted),
   *  `rows` of it, `error` whether it failed; `received_ns` its arrival, `input_ns`/`output_ns` the server's parse and
   *  encode. Counts it, releases its admission and updates the recent compute time. */
  void Answered(const RequestObj* request, int64_t rows, bool error, int64_t received_ns, int64_t input_ns,
                int64_t output_ns);
  /*! \brief A request refused before admission (a bad body, a full queue): a failure. */
  void Refused(int64_t received_ns);

  /*! \brief The model's metadata (KServe v2 JSON). */
  std::string Metadata() const;
  /*! \brief Triton's model configuration as JSON: max_batch_size and dims without the batch dimension when batched,
   *  one instance per stream (and the devices holding its replicas as `gpus` when the Runtime has several),
   *  dynamic_batching, and the parameters tvmsched serves it with (priority, placement, qos_ms, max_queue, streams,
   *  policy). */
  std::string Config() const;

  const ServedOptions options;
  const Runtime runtime;
  std::vector<kserve::TensorInfo> inputs, outputs;
  int64_t batch = 0;                                   ///< rows a request may bring (0: not compiled for a batch: one)
  int64_t warmup_executions = 0, warmup_requests = 0;  ///< the engine's counts at load (warm-up runs)
  double qos_ms = -1;                                  ///< its latency target (< 0: none)
  std::string priority;                                ///< realtime or best_effort
  Duration success, fail, queue, compute_input, compute_infer, compute_output;
  std::atomic<int64_t> inferences{0};  ///< rows of the successful requests (Triton's inference count)
  std::atomic<int64_t> executions{0};  ///< requests that ran (a batched model's: the engine's launches)
  std::atomic<int64_t> pending{0}, last_ms{0}, qos_violations{0};
  std::atomic<int64_t> recent_ns{0};  ///< recent compute time per request (an average of the latest; 0: none yet)
  /*! \brief Successful requests' submit-to-finish time in the engine: its sum, count and per bucket of
   *  kLatencyBuckets (not cumulative; over 10 s: in the count only). */
  std::atomic<int64_t> latency_ns{0}, latency_count{0};
  std::atomic<int64_t> latency_buckets[std::size(kLatencyBuckets)] = {};

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tvmsched.Served", ServedObj, ffi::Object);
};

class Served : public ffi::ObjectRef {
 public:
  TVM_FFI_DEFINE_OBJECT_REF_METHODS_NULLABLE(Served, ffi::ObjectRef, ServedObj);
};

/*! \brief Which of `models` a request names: `name` at `version` (empty: any). Else a kserve::Error 404 with both
 *  servers' line: "no model named 'NAME' is loaded (loaded: ...)" or "model 'NAME' has no version 'V' (it has version
 *  W)". */
size_t Find(const std::vector<Served>& models, std::string_view name, std::string_view version);

/*! \brief Triton's statistics JSON ({"model_stats": [...]}) of `models`, in order (the Runtime's counters read once).
 */
std::string Statistics(const std::vector<Served>& models);
/*! \brief /v1/models (examples/server.py's contract): {NAME: {"qos_ms", "priority", "inputs": {INPUT: shape}}}. */
std::string V1Models(const std::vector<Served>& models);
/*! \brief /v1/stats: per model the Runtime's stats (ModelStats' keys; requests and executions without the warm-up
 *  runs), its streams and each one's completed requests; `_scheduler` (the policy and its decision times), `_memory`
 *  (a budgeted device: budget, in_use, peak, each model's footprint, the resident models) and `_device` (its fault
 *  state, docs/faults.md). */
std::string V1Stats(const std::vector<Served>& models);
/*! \brief tvmsched's own metric families of `models` (Prometheus text), per model: tvmsched_requests_total,
 *  tvmsched_errors_total (answered with an error, refusals included), tvmsched_qos_violations_total,
 *  tvmsched_preemptions_total, tvmsched_launches_total, tvmsched_reruns_total (launches run again after a preemption),
 *  the gauge tvmsched_model_resident, the histogram tvmsched_request_latency_seconds (submit to finish in the
 *  engine), and for a model streamed from the host tiers tvmsched_tier_bytes{tier} (gauge) and
 *  tvmsched_streamed_bytes_total; per switching stage tvmsched_switch_stages_total{stage}; per device the gauge
 *  tvmsched_busy_streams (streams with requests queued or running). */
std::string TvmschedMetrics(const std::vector<Served>& models);
/*! \brief Triton's nv_inference_* metric families of `models` (Prometheus text, Triton's names and labels). */
std::string TritonMetrics(const std::vector<Served>& models);

}  // namespace serving
}  // namespace tvmsched

#endif  // TVMSCHED_SERVING_H_
