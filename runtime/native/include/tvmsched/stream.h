/*!
 * \file tvmsched/stream.h
 * \brief One tenant's request stream over a Model: a request queue (each request carries its
 *        candidate-ID list), a submitter thread keeping at most K launches in flight, REEF-style
 *        preempt()/resume(), completion callbacks, the progress bitmap and a per-launch timeline.
 *
 * Semantics (unchanged from the Python runtime, docs/preemption.md):
 * - preempt(): pause the submitter, set the flag (instrumented kernels skip their remaining blocks
 *   or chunks), wait until the device holds none of this stream's work, and record the launches to
 *   run again: idempotent ones that were in flight, non-idempotent ones that never started. A
 *   non-idempotent kernel that started runs to its end and is never repeated; on a GPU one is never
 *   launched while earlier launches are in flight.
 * - resume(): clear the flag; the recorded launches run first, in order.
 * Outputs after any number of cycles are bit-identical to an uninterrupted run.
 *
 * Threads: the stream owns its submitter (and, for CUDA models that count progress, a progress
 * reader); both are joined by Close() or the destructor. The submitter holds a reference to the
 * stream, so a stream nobody else holds is closed by its submitter once idle (checked every 100 ms).
 * All queue state is guarded by `mutex_`; completion callbacks run on the submitter thread outside
 * the lock, deferred ones (Python's) on the engine's callback thread.
 */
#ifndef TVMSCHED_STREAM_H_
#define TVMSCHED_STREAM_H_

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tvmsched/model.h"

namespace tvmsched {

/*! \brief One kernel launch of one request. */
struct Launch {
  int64_t request = 0;
  int layer = 0;
  int candidate = 0;
};

/*! \brief A timeline record: one launch from its submission to its observed completion (µs, Device::NowMicros). */
struct LaunchRecord {
  int64_t request;
  int layer, candidate;
  double start_us, end_us;
};

enum class RequestState : int { kQueued = 0, kRunning = 1, kDone = 2, kFailed = 3 };

class RequestObj : public ffi::Object {
 public:
  int64_t id = 0;                  ///< set when it starts: the request number its launches carry (1, 2, ...)
  int restarts = 0;                ///< times it started again from its first layer after a device fault (at most once)
  bool device_lost = false;        ///< it failed because its device was lost when its next launch was to enter it
  std::vector<int> candidate_ids;  ///< empty: candidate 0 everywhere
  ffi::Map<ffi::String, ffi::Tensor> inputs;
  double submitted_us = 0, started_us = 0, finished_us = 0;

  RequestState state() const { return static_cast<RequestState>(state_.load(std::memory_order_acquire)); }
  bool done() const { return state() >= RequestState::kDone; }
  /*! \brief Wait until done (spinning `spin_us` first); false on timeout (< 0: no timeout). */
  bool Wait(double timeout_s, double spin_us);
  ffi::Map<ffi::String, ffi::Tensor> outputs() const { return outputs_; }
  ffi::String error() const { return error_; }
  /*! \brief Call `callback(request)` once when done (at once, on the caller's thread, if it already is): on the
   *  stream's submitter thread, which waits for it before its next launch (keep it short), or, `deferred`, on the
   *  engine's callback thread (for callbacks that may block: a Python one waits for the GIL there, not the stream). */
  void OnDone(ffi::Function callback, bool deferred = false);
  /*! \brief Call `hook()` once as the request finishes, before anyone can see it done (at once if it is already
   *  finishing or done): for the engine's own bookkeeping that a waiter must find done (the preemption group's
   *  release: when a real-time request's result is seen, the best-effort streams have been resumed). Keep it short
   *  and never block: it runs on the submitter thread. */
  void OnFinishing(std::function<void()> hook);
  /*! \brief Finish (called once by the stream's submitter). */
  void Finish(ffi::Map<ffi::String, ffi::Tensor> outputs, ffi::String error, double finished_us);

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tvmsched.Request", RequestObj, ffi::Object);

 private:
  std::atomic<int> state_{0};
  ffi::Map<ffi::String, ffi::Tensor> outputs_;
  ffi::String error_;
  std::mutex mutex_;  // guards callbacks_ and the wait condition
  std::condition_variable cond_;
  std::vector<ffi::Function> callbacks_;

 public:
  /*! \brief Latest start (µs, Device::NowMicros; 0: none): a request still queued then fails instead of starting
   *  (StreamObj::SubmitBy). Last, so that code built against the layout before it still reads the fields above. */
  double deadline_us = 0;

 private:
  std::vector<ffi::Function> deferred_;                 // OnDone(..., deferred): run by the engine's callback thread
  std::vector<std::function<void()>> finishing_hooks_;  // OnFinishing: run before the state says done
  bool finishing_ = false;
};

/*! \brief Stop the engine's callback thread once what it holds has run (at most `timeout_s`); later deferred
 *  callbacks run on the submitter thread. For a process about to exit (Python: before the interpreter finalizes).
 *  Returns whether it drained in time. */
bool StopDeferredCallbacks(double timeout_s);

class Request : public ffi::ObjectRef {
 public:
  TVM_FFI_DEFINE_OBJECT_REF_METHODS_NULLABLE(Request, ffi::ObjectRef, RequestObj);
};

/*! \brief What one preempt() did. */
struct PreemptReport {
  double seconds = 0;
  std::vector<Launch> rerun;     ///< launches resume() submits again, in order
  std::vector<Launch> finished;  ///< non-idempotent launches that were let run to their end
};

/*! \brief Requests queued behind the running one that the resource monitor lays out (ReadState). */
constexpr int kMonitorLookahead = 4;

/*! \brief What the resource monitor reads of a stream (a consistent snapshot). */
struct StreamState {
  std::vector<int64_t> done;             ///< per layer, blocks the running request has completed (-1: not started)
  std::vector<int64_t> blocks;           ///< per layer, the blocks of its chosen candidate
  std::vector<int> ids;                  ///< the running request's candidate ids (empty: candidate 0)
  std::vector<std::vector<int>> queued;  ///< candidate ids of the requests queued behind it
};

/*! \brief The resource monitor's copy of a stream's state (StreamObj::ReadState), its buffers reused between reads. */
struct StreamSnapshot {
  int rows = 0;               ///< 0: idle; else the running request and the rows - 1 queued behind it
  std::vector<int64_t> done;  ///< per layer, as StreamState::done
  std::vector<int32_t> ids;   ///< rows x layers: each row's candidate ids (candidate 0 where a request was given none)
};

struct StreamOptions {
  int max_in_flight = kDefaultInFlight;  ///< launches kept on a GPU at once (CPU launches are synchronous)
  /*! \brief Its kernels' streams: high for a real-time tenant, low for a best-effort one (Device::CreateStream). */
  StreamPriority priority = StreamPriority::kNormal;
  double idle_spin_us = 200;        ///< the submitter polls this long for new work before sleeping
  double progress_interval_ms = 1;  ///< CUDA counters copied to the bitmap this often
  /*! \brief The watchdog: a request whose next launch has waited this long for its model to be switched in
   *  (a stage that makes no progress) fails with one line naming that stage (0: it waits as long as it takes). */
  double stall_timeout_s = 60;
  /*! \brief Device faults (docs/faults.md): a launch waits at most this long for the device to recover, and a
   *  recovery waits this long for the launches running at the fault to end (else the device is lost). */
  double recovery_timeout_s = 30;
  int fault_limit = 3;  ///< faults of one model within fault_window_s that quarantine it (0: never)
  double fault_window_s = 60;
};

class StreamObj : public ffi::Object {
 public:
  StreamObj(Model model, std::string name, StreamOptions options);
  ~StreamObj();
  /*! \brief Start the submitter (and progress) threads (Stream::Create calls it once). */
  void Start();

  const Model& model() const { return model_; }
  const std::string& name() const { return name_; }

  /*! \brief Queue one request (inputs checked now: a bad request raises and queues nothing). */
  Request Submit(ffi::Map<ffi::String, ffi::Tensor> inputs, std::vector<int> candidate_ids);
  /*! \brief Submit with a deadline to start (µs, Device::NowMicros; 0: none): if the request is still queued at
   *  `deadline_us`, it fails with one line instead of running (it never runs late). */
  Request SubmitBy(ffi::Map<ffi::String, ffi::Tensor> inputs, std::vector<int> candidate_ids, double deadline_us);
  /*! \brief Stop this stream's device work as fast as possible; harmless when idle or paused.
   *  abort=false only pauses and waits for the device work to end (the no-preemption baseline).
   *  wait=false: set the flag, pause and return at once (the report has no launches); on an asynchronous device
   *  the stream's own thread then waits for its launches in flight. A waiting Preempt() of a stream already paused
   *  waits too (for the launch still running, or the drain) and reports 0 seconds. */
  PreemptReport Preempt(bool abort = true, bool wait = true);
  /*! \brief Clear the flag and go on. On an asynchronous device, launches in flight since the flag was set may have
   *  obeyed it: they are waited for first (the idempotent ones run again), never taken as done. wait=false: a stream
   *  whose own thread has yet to drain them (a Preempt() that did not wait) resumes once it has, and the caller
   *  does not wait (the preemption group's release, on a real-time stream's thread); a Preempt() before then
   *  cancels that resume. */
  void Resume(bool wait = true);
  /*! \brief A paused stream whose request started runs that request to its end and pauses again (its queued
   *  requests stay queued): what a policy does when another model's switch-in waits for the memory the started
   *  request holds. False (nothing done) when the stream is not paused or its request has not started. */
  bool FinishStarted();
  bool paused() const;
  bool busy() const;
  /*! \brief Where it takes its requests besides Submit (the engine Runtime's queue of its model): `source()` is called
   *  on the submitter thread, outside the stream's lock, when nothing is queued on the stream and it was poked since
   *  the last call or has just finished a request; it returns the requests to run next, in order (inputs checked,
   *  candidate ids chosen; none: the stream waits to be poked). Set once, before requests come. */
  using Source = std::function<std::vector<Request>()>;
  void SetSource(Source source);
  /*! \brief Its source has work: the stream asks it as soon as nothing is queued on it. */
  void Poke();
  /*! \brief Its source has nothing for it until it is poked again (another stream took the work): once idle, it
   *  sleeps at once instead of polling for idle_spin_us (a core another stream needs on a small machine). */
  void Rest() { rest_.store(true, std::memory_order_relaxed); }
  /*! \brief Requests queued or running (a lock-free read; for choosing among a model's streams). */
  int64_t pending() const { return queued_.load(std::memory_order_relaxed); }
  /*! \brief The running request's progress; nullopt when idle. */
  std::optional<StreamState> State();
  /*! \brief The resource monitor's read: the same state without taking the stream's lock (a sequence lock; it
   *  takes the lock only after many torn reads), the requests queued behind the running one cut to
   *  kMonitorLookahead, into `out`'s buffers (no allocation once warm). Progress as the stream last published it:
   *  by completed layers, or by the counters as the progress thread (asynchronous) or a State() last folded them.
   *  False when idle. */
  bool ReadState(StreamSnapshot* out) const;
  /*! \brief Per layer, per candidate: the blocks a launch runs (fixed at creation). */
  /*! \brief Fold the kernels' progress counters into the bitmap. */
  void SyncProgress();
  void RecordTimeline(bool on);
  std::vector<LaunchRecord> Timeline() const;
  /*! \brief Submit-to-finish times of the latest completed requests (8192 to 16384 of them), in completion
   *  order; `completed` counts them all. */
  std::vector<double> Latencies() const;
  /*! \brief Finish queued requests (resuming if paused), then stop the submitter. */
  void Close();

  std::atomic<int64_t> launches{0}, reruns{0}, completed{0}, failed{0}, preemptions{0};
  // device faults: launches of this stream that faulted; requests started again after another tenant's fault
  std::atomic<int64_t> faults{0}, fault_restarts{0};
  /*! \brief Its completed requests' times from start to end, summed (µs): the work it did (a device's load). */
  std::atomic<int64_t> busy_us{0};

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tvmsched.Stream", StreamObj, ffi::Object);

 private:
  /*! \brief Its run state: whether launches go on, and what a pause still owes (docs/preemption.md). Every change
   *  goes through To(), which checks it against the transitions below.
   *    kRunning          launches go on
   *    kFinishing        FinishStarted(): the started request runs to its end, then kPaused (its queue stays)
   *    kPaused           no launches; nothing of it in flight is undecided
   *    kUndrained        paused on an asynchronous device: launches in flight since the flag was set may have obeyed
   *                      it; they are drained (DrainAsync) before the flag clears or the stream goes on
   *    kResumeAfterDrain kUndrained, and a Resume(wait=false) came: the drain resumes the stream
   *  Preempt: kRunning/kFinishing -> kPaused (synchronous) or kUndrained (asynchronous); kResumeAfterDrain ->
   *  kUndrained. Drain: kUndrained/kResumeAfterDrain -> kPaused (then kRunning for kResumeAfterDrain). Resume:
   *  kPaused/kFinishing -> kRunning, kUndrained -> kResumeAfterDrain (wait=false). FinishStarted: kPaused ->
   *  kFinishing. The end of the running request: kFinishing -> kPaused. */
  enum class RunState : int { kRunning, kFinishing, kPaused, kUndrained, kResumeAfterDrain };
  static const char* StateName(RunState state);
  /*! \brief Change the run state (under mutex_); a transition not listed above is an engine bug (it aborts the call).
   */
  void To(RunState next);
  bool paused_locked() const { return state_ >= RunState::kPaused; }
  bool undrained() const { return state_ >= RunState::kUndrained; }

  using Done = std::pair<Request, std::pair<ffi::Map<ffi::String, ffi::Tensor>, std::string>>;
  void SubmitLoop();
  void ProgressLoop();
  bool HasWork() const;
  std::optional<Launch> NextLaunch();
  bool MayLaunch(const Launch& launch) const;
  bool StartRequest();
  /*! \brief The next launch waits for the model's placement to prepare `group` (the placement was asked by
   *  Acquire); true: the head request failed instead (it cannot be prepared); go on. */
  bool Gate(int group);
  /*! \brief A request left the queue (done or failed): the model's users and its placement hear it. */
  void EndRequest();
  /*! \brief After the head request ended: pause again if FinishStarted() asked for it (under mutex_). */
  void PauseAfterRequest();
  /*! \brief Synchronous device: run `launch` on this thread, then take the next one in the same critical section. */
  void StepSync(const Launch& launch, std::optional<Launch>* next);
  /*! \brief Asynchronous device: issue `launch` and record its event (it joins the launches in flight). */
  void LaunchAsync(const Launch& launch);
  void RetireCompleted(bool wait_oldest);
  /*! \brief Asynchronous device, kUndrained: wait for the launches in flight (the flag set); the idempotent ones run
   *  again, the others finished. Leaves kPaused (kRunning from kResumeAfterDrain). */
  std::vector<Launch> DrainAsync();
  /*! \brief Clear the flag and let the submitter go on (under the lock): kPaused -> `to`. */
  void Unpause(RunState to = RunState::kRunning);
  void Retire(const Launch& launch, double end_us);
  void FailHead(const std::string& error, bool device_lost = false);  // device_lost: RequestObj::device_lost
  /*! \brief The head request started before the device recovered from a fault: it starts again from its first
   *  layer (once; a second time it fails). Under mutex_. */
  void RestartHead();
  /*! \brief Wait for the launches in flight and forget them (their request starts again). Under mutex_. */
  void DiscardInFlight();
  /*! \brief A launch's error that is a device fault: recover the device (this thread) and return the tenant's
   *  one line; else empty. */
  std::string HandleFault(const Launch& launch, const std::string& error);
  void Deliver();
  /*! \brief The source may have work for it now (under mutex_). */
  bool MayPull() const {
    return source_ && !closed_ && !paused_locked() && requests_.empty() && pull_.load(std::memory_order_acquire);
  }
  /*! \brief Ask the source (without the lock) and queue what it gives. */
  void Pull();
  bool idempotent(const Launch& l) const { return idempotent_[l.layer][l.candidate]; }

  Model model_;
  ModelObj* m_;  // model_.get(), used by the submitter only
  std::string name_;
  StreamOptions options_;
  bool async_;  // its device launches asynchronously: launches in flight, events, drains
  std::vector<std::vector<bool>> idempotent_;
  std::vector<std::vector<int64_t>> blocks_, threads_;

  mutable std::mutex mutex_;  // guards everything below up to `thread_`
  std::condition_variable cond_;
  std::deque<Request> requests_;
  std::vector<Launch> rerun_;
  int next_layer_ = 0;
  std::deque<std::pair<Launch, EventHandle>> in_flight_;
  std::optional<Launch> running_;
  std::deque<Done> done_;
  RunState state_ = RunState::kRunning;
  bool closed_ = false;  // Close(): no more requests; the submitter ends once the queued ones are done
  int64_t request_ids_ = 0;
  std::vector<int64_t> progress_;
  std::atomic<bool> timeline_on_{false};
  std::vector<LaunchRecord> timeline_;
  std::vector<double> latencies_;
  std::map<std::tuple<int64_t, int, int>, double> launched_at_;
  bool gated_ = false;         // the next launch waits for a registered model's switcher
  double gated_since_us_ = 0;  // when it began waiting (the watchdog's clock)
  int gated_group_ = -1;       // for what: a sub-task, or -1: the environment
  /*! \brief The watchdog's verdict on a gated head request (under mutex_): its error line, or empty. */
  std::string Stalled() const;
  bool waiting_ = false;     // the asynchronous submitter is blocked on an event (outside the lock)
  int preempt_waiting_ = 0;  // Preempt() calls waiting on cond_ for the running launch to return
  // synchronous device: Preempt() set the flag while the running launch ran (it may have skipped work even if a
  // Resume() cleared the flag before it returned): it runs again
  bool flagged_launch_ = false;
  /*! \brief Under mutex_: an asynchronous device's launches in flight drained before the flag clears (Resume,
   *  FinishStarted): waits for the launch being issued and the event being waited on. False: resumed meanwhile. */
  bool DrainBeforeClearing(std::unique_lock<std::mutex>& lock);
  /*! \brief Under mutex_, paused: wait until no launch is being issued or waited on (or a Resume(), or another
   *  thread drained), then on an asynchronous device drain what is in flight. The launches the drain let finish. */
  std::vector<Launch> Quiesce(std::unique_lock<std::mutex>& lock);
  uint64_t run_generation_ = 0;     // the device's generation when the head request started (the submitter's alone)
  std::atomic<int64_t> queued_{0};  // requests_.size(), polled by the idle submitter
  Source source_;
  std::atomic<bool> pull_{false};  // ask the source: it was poked, or a request just ended
  std::atomic<bool> rest_{false};  // Rest(): skip the next idle poll
  /*! \brief Under mutex_: copy the progress of `layer` (-1: every layer; -2: none) and, if `queue`, the requests'
   *  candidate ids to what ReadState reads, between two steps of the sequence number (odd while writing). */
  void Publish(int layer, bool queue);
  /*! \brief ReadState's copy of the published state: 1 busy, 0 idle, -1 torn (read again); under mutex_ it cannot
   *  be torn. */
  int CopyPublished(StreamSnapshot* out) const;
  std::atomic<uint64_t> seq_{0};
  std::atomic<int> pub_rows_{0};  // requests published: the running one, then up to kMonitorLookahead queued
  std::unique_ptr<std::atomic<int64_t>[]> pub_done_;  // per layer
  std::unique_ptr<std::atomic<int32_t>[]> pub_ids_;   // per row, per layer
  std::thread thread_, progress_thread_;
};

class Stream : public ffi::ObjectRef {
 public:
  static Stream Create(Model model, std::string name, StreamOptions options = {});
  TVM_FFI_DEFINE_OBJECT_REF_METHODS_NULLABLE(Stream, ffi::ObjectRef, StreamObj);
};

}  // namespace tvmsched

#endif  // TVMSCHED_STREAM_H_
