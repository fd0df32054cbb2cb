#include "tvmsched/stream.h"

#include <tvm/ffi/cast.h>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <chrono>
#include <sstream>

namespace tvmsched {

namespace {

constexpr size_t kMaxLatencies = 1 << 14;  // latencies a stream keeps (Latencies(): between half and all of them)

/*! \brief Poll `ready` for up to `spin_us`, yielding the core to any other runnable thread between polls
 *  (a hand-off between threads then costs no futex wake-up, and a busy core loses little). */
void SpinUntil(const std::function<bool()>& ready, double spin_us) {
  double until = Device::NowMicros() + spin_us;
  while (!ready() && Device::NowMicros() < until) std::this_thread::yield();
}

std::string OneLine(const std::string& text) {
  // the last non-empty line: TVM and tvm-ffi put the reason there
  std::string best;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    std::string line = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (line.find_first_not_of(" \t") != std::string::npos) best = line;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return best;
}

}  // namespace

// ---- Request ---------------------------------------------------------------------------------

bool RequestObj::Wait(double timeout_s, double spin_us) {
  SpinUntil([this] { return done(); }, spin_us);
  if (done()) return true;
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout_s < 0) {
    cond_.wait(lock, [this] { return done(); });
    return true;
  }
  return cond_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return done(); });
}

namespace {

/*! \brief The engine's callback thread: runs deferred completion callbacks in order, off every submitter thread.
 *  Leaked on purpose (its detached thread may outlive static destruction); StopDeferredCallbacks ends it. */
class CallbackThread {
 public:
  static CallbackThread& Get() {
    static CallbackThread* one = new CallbackThread();
    return *one;
  }

  void Post(Request request, std::vector<ffi::Function> callbacks) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!stopped_) {
        queue_.emplace_back(std::move(request), std::move(callbacks));
        if (!started_) {
          started_ = true;
          std::thread([this] { Loop(); }).detach();
        }
        cond_.notify_all();
        return;
      }
    }
    Run(request, callbacks);  // stopped (the process is exiting): here, as before the thread existed
  }

  bool Stop(double timeout_s) {
    std::unique_lock<std::mutex> lock(mutex_);
    bool drained =
        cond_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return queue_.empty() && !running_; });
    stopped_ = true;
    cond_.notify_all();
    return drained;
  }

 private:
  static void Run(const Request& request, const std::vector<ffi::Function>& callbacks) {
    for (const auto& callback : callbacks) {
      try {
        callback(request);
      } catch (const std::exception&) {  // a failing callback must not stop the others
      }
    }
  }

  void Loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      cond_.wait(lock, [this] { return !queue_.empty() || stopped_; });
      if (queue_.empty()) return;  // stopped
      auto item = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      lock.unlock();
      Run(item.first, item.second);
      item = {};  // the last references (a Python callable) go here, not under the lock
      lock.lock();
      running_ = false;
      cond_.notify_all();  // Stop() waits for an empty queue
    }
  }

  std::mutex mutex_;
  std::condition_variable cond_;
  std::deque<std::pair<Request, std::vector<ffi::Function>>> queue_;
  bool started_ = false, stopped_ = false, running_ = false;
};

}  // namespace

bool StopDeferredCallbacks(double timeout_s) { return CallbackThread::Get().Stop(timeout_s); }

void RequestObj::OnDone(ffi::Function callback, bool deferred) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!done()) {
      (deferred ? deferred_ : callbacks_).push_back(std::move(callback));
      return;
    }
  }
  callback(Request(ffi::GetObjectPtr<RequestObj>(this)));
}

void RequestObj::OnFinishing(std::function<void()> hook) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!finishing_ && !done()) {
      finishing_hooks_.push_back(std::move(hook));
      return;
    }
  }
  hook();
}

void RequestObj::Finish(ffi::Map<ffi::String, ffi::Tensor> outputs, ffi::String error, double finished) {
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finishing_ = true;
    hooks.swap(finishing_hooks_);
  }
  for (auto& hook : hooks) hook();  // before a waiter can see it done
  std::vector<ffi::Function> callbacks, deferred;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    outputs_ = std::move(outputs);
    error_ = std::move(error);
    finished_us = finished;
    state_.store(static_cast<int>(error_.empty() ? RequestState::kDone : RequestState::kFailed),
                 std::memory_order_release);
    callbacks.swap(callbacks_);
    deferred.swap(deferred_);
  }
  cond_.notify_all();
  Request self(ffi::GetObjectPtr<RequestObj>(this));
  for (auto& callback : callbacks) {
    try {
      callback(self);
    } catch (const std::exception&) {  // a failing callback must not stop the submitter
    }
  }
  if (!deferred.empty()) CallbackThread::Get().Post(self, std::move(deferred));
}

// ---- Stream ----------------------------------------------------------------------------------

Stream Stream::Create(Model model, std::string name, StreamOptions options) {
  auto stream = ffi::make_object<StreamObj>(std::move(model), std::move(name), options);
  stream->Start();
  return Stream(stream);
}

void StreamObj::Start() {
  // the submitter holds a reference: the stream lives while it works, and the last reference can be
  // dropped on that thread (a callback) without the destructor joining its own thread
  thread_ = std::thread([self = ffi::GetObjectPtr<StreamObj>(this)]() mutable {
    self->SubmitLoop();
    self.reset();  // may run the destructor here; it then detaches this thread
  });
  if (async_ && m_->counts_progress()) progress_thread_ = std::thread([this] { ProgressLoop(); });
}

StreamObj::StreamObj(Model model, std::string name, StreamOptions options)
    : model_(std::move(model)), m_(model_.get()), name_(std::move(name)), options_(options) {
  if (!m_->instrumented()) {
    TVM_FFI_THROW(TvmschedError) << "preemption needs an artifact compiled with preempt checks (the default)";
  }
  if (options_.max_in_flight < 1) TVM_FFI_THROW(TvmschedError) << "max_in_flight must be at least 1";
  async_ = m_->device().launches_async();  // a window of launches in flight, events, a progress thread
  m_->SetStreamPriority(options_.priority);
  if (async_ && m_->reuse_distance() < options_.max_in_flight) m_->Replan(options_.max_in_flight);
  for (const LayerSpec& layer : m_->manifest().layers) {
    std::vector<bool> idem;
    std::vector<int64_t> blocks, threads;
    for (const CandidateSpec& c : layer.candidates) {
      idem.push_back(c.idempotent);
      blocks.push_back(c.blocks);
      threads.push_back(c.threads);
    }
    idempotent_.push_back(idem);
    blocks_.push_back(blocks);
    threads_.push_back(threads);
  }
  progress_.assign(m_->num_layers(), -1);
  pub_done_ = std::make_unique<std::atomic<int64_t>[]>(m_->num_layers());
  pub_ids_ = std::make_unique<std::atomic<int32_t>[]>(static_cast<size_t>(m_->num_layers()) * (1 + kMonitorLookahead));
  Publish(-1, true);
  m_->SetWaker([this] {  // a placement that prepares on demand wakes this stream when it prepared something
    {
      std::lock_guard<std::mutex> lock(mutex_);
      gated_ = false;
    }
    cond_.notify_all();
  });
}

StreamObj::~StreamObj() { Close(); }

Request StreamObj::Submit(ffi::Map<ffi::String, ffi::Tensor> inputs, std::vector<int> candidate_ids) {
  return SubmitBy(std::move(inputs), std::move(candidate_ids), 0);
}

Request StreamObj::SubmitBy(ffi::Map<ffi::String, ffi::Tensor> inputs, std::vector<int> candidate_ids,
                            double deadline_us) {
  m_->CheckInputs(inputs);
  if (!candidate_ids.empty()) m_->CheckCandidates(candidate_ids);
  if (std::string quarantined = m_->quarantined(); !quarantined.empty()) TVM_FFI_THROW(TvmschedError) << quarantined;
  auto request = ffi::make_object<RequestObj>();
  request->inputs = std::move(inputs);
  request->candidate_ids = std::move(candidate_ids);
  request->submitted_us = Device::NowMicros();
  request->deadline_us = deadline_us;
  m_->AddUser();  // in use from now on: its switcher does not evict it
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) {
      m_->users.fetch_sub(1);
      TVM_FFI_THROW(TvmschedError) << "stream " << name_ << " is closed";
    }
    requests_.emplace_back(request);
    queued_.fetch_add(1, std::memory_order_release);
    if (requests_.size() <= 1 + kMonitorLookahead) Publish(-2, true);
    // stage 1 starts now (paused: when it resumes, so a paused task holds up no other switch-in)
    if (!paused_locked() && !m_->resident()) m_->placement()->Demand(m_, -1);
  }
  cond_.notify_all();
  return Request(request);
}

void StreamObj::SetSource(Source source) {
  std::lock_guard<std::mutex> lock(mutex_);
  source_ = std::move(source);
}

void StreamObj::Poke() {
  {
    std::lock_guard<std::mutex> lock(mutex_);  // (so that the submitter cannot miss it between its check and its wait)
    pull_.store(true, std::memory_order_release);
  }
  cond_.notify_all();
}

void StreamObj::Pull() {
  pull_.store(false, std::memory_order_release);  // (a Poke() from now on asks again)
  std::vector<Request> got = source_();
  if (got.empty()) return;
  for (size_t i = 0; i < got.size(); ++i) m_->AddUser();  // in use from now on: its switcher does not evict it
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Request& request : got) requests_.push_back(std::move(request));
    queued_.fetch_add(static_cast<int64_t>(got.size()), std::memory_order_release);
    Publish(-2, true);
    if (!paused_locked() && !m_->resident()) m_->placement()->Demand(m_, -1);
  }
  cond_.notify_all();
}

PreemptReport StreamObj::Preempt(bool abort, bool wait) {
  double start = Device::NowMicros();
  PreemptReport report;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    bool pausing = !paused_locked() && !closed_;
    // a Resume(wait=false) still waiting for the drain: this preemption comes after it
    if (state_ == RunState::kResumeAfterDrain) To(RunState::kUndrained);
    if (pausing) {
      To(async_ ? RunState::kUndrained : RunState::kPaused);
      ++preemptions;
      if (abort) m_->SetPreemptFlag(true);
      if (abort && running_) flagged_launch_ = true;
      m_->placement()->Yield(m_);  // a paused task holds up no other switch-in
    }
    if (!wait || !paused_locked()) {  // the submitter drains what is in flight (SubmitLoop); or closed
      report.rerun = rerun_;
      if (pausing) report.seconds = (Device::NowMicros() - start) / 1e6;
      lock.unlock();
      if (pausing) cond_.notify_all();
      return report;
    }
    // synchronous: the kernel returns within one chunk; asynchronous: the submitter stops waiting on an event. Also
    // when an earlier Preempt() that did not wait paused it: the launch it left running or its drain ends first
    ++preempt_waiting_;
    report.finished = Quiesce(lock);
    --preempt_waiting_;
    report.rerun = rerun_;
    if (pausing) report.seconds = (Device::NowMicros() - start) / 1e6;  // 0: it was paused already
  }
  Deliver();
  return report;
}

std::vector<Launch> StreamObj::Quiesce(std::unique_lock<std::mutex>& lock) {
  // a Resume() meanwhile ends the wait: the stream runs on (waiting for it to idle would last while it has work)
  cond_.wait(lock,
             [this] { return (!running_.has_value() && !waiting_) || !paused_locked() || (async_ && !undrained()); });
  if (undrained()) return DrainAsync();  // (asynchronous devices only)
  return {};
}

bool StreamObj::DrainBeforeClearing(std::unique_lock<std::mutex>& lock) {
  if (undrained()) Quiesce(lock);
  return paused_locked();
}

void StreamObj::Resume(bool wait) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (state_ == RunState::kFinishing) To(RunState::kRunning);  // it does not pause again after its request
    if (!paused_locked()) return;
    if (!wait && undrained()) {  // its own thread drains, then resumes it (DrainAsync)
      if (state_ == RunState::kUndrained) To(RunState::kResumeAfterDrain);
      return;
    }
    if (DrainBeforeClearing(lock)) Unpause();  // (else resumed meanwhile: by the drain, or another Resume())
  }
  cond_.notify_all();
  Deliver();  // what a drain finished
}

void StreamObj::Unpause(RunState to) {
  m_->SetPreemptFlag(false);
  To(to);
  gated_ = false;  // Preempt() took its task out of its switcher's queue: the next launch demands again
  m_->placement()->Resumed(m_);
}

bool StreamObj::FinishStarted() {
  bool finishing = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!paused_locked()) return false;
    // (not paused after the drain: a Resume(wait=false) before it resumed the stream)
    if (DrainBeforeClearing(lock) && !requests_.empty() && (next_layer_ > 0 || !rerun_.empty())) {
      Unpause(RunState::kFinishing);
      finishing = true;
    }
  }
  cond_.notify_all();
  Deliver();  // what a drain finished
  return finishing;
}

void StreamObj::PauseAfterRequest() {
  if (state_ != RunState::kFinishing) return;
  To(RunState::kPaused);
  m_->placement()->Yield(m_);
}

bool StreamObj::paused() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return paused_locked();
}

const char* StreamObj::StateName(RunState state) {
  switch (state) {
    case RunState::kRunning:
      return "running";
    case RunState::kFinishing:
      return "finishing";
    case RunState::kPaused:
      return "paused";
    case RunState::kUndrained:
      return "undrained";
    case RunState::kResumeAfterDrain:
      return "resume-after-drain";
  }
  return "?";
}

void StreamObj::To(RunState next) {
  using S = RunState;
  bool allowed = false;
  switch (state_) {
    case S::kRunning:  // Preempt
      allowed = next == (async_ ? S::kUndrained : S::kPaused);
      break;
    case S::kFinishing:  // Preempt; its request ended; Resume
      allowed = next == (async_ ? S::kUndrained : S::kPaused) || next == S::kPaused || next == S::kRunning;
      break;
    case S::kPaused:  // Resume; FinishStarted
      allowed = next == S::kRunning || next == S::kFinishing;
      break;
    case S::kUndrained:  // the drain; Resume(wait=false)
      allowed = next == S::kPaused || next == S::kResumeAfterDrain;
      break;
    case S::kResumeAfterDrain:  // the drain (which then resumes it); a Preempt comes after the Resume
      allowed = next == S::kPaused || next == S::kUndrained;
      break;
  }
  TVM_FFI_ICHECK(allowed) << "stream " << name_ << ": run state " << StateName(state_) << " -> " << StateName(next)
                          << " is not a transition of the stream's state machine";
  state_ = next;
}

bool StreamObj::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !requests_.empty();
}

std::optional<StreamState> StreamObj::State() {
  if (m_->counts_progress() && !async_) SyncProgress();
  std::lock_guard<std::mutex> lock(mutex_);
  if (requests_.empty()) return std::nullopt;
  StreamState state;
  state.done = progress_;
  state.ids = requests_.front()->candidate_ids;
  for (int i = 0; i < m_->num_layers(); ++i) state.blocks.push_back(blocks_[i][state.ids.empty() ? 0 : state.ids[i]]);
  for (size_t i = 1; i < requests_.size(); ++i) state.queued.push_back(requests_[i]->candidate_ids);
  return state;
}

void StreamObj::SyncProgress() {
  int64_t request;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (requests_.empty()) return;  // idle: a registered model's counters may be gone
    request = request_ids_;
  }
  std::vector<int32_t> counts = m_->ReadCounters();
  std::lock_guard<std::mutex> lock(mutex_);
  if (request != request_ids_ || requests_.empty() || progress_[0] < 0)
    return;  // another request started, or none runs
  const auto& ids = requests_.front()->candidate_ids;
  for (size_t layer = 0; layer < counts.size(); ++layer) {
    int c = ids.empty() ? 0 : ids[layer];
    int64_t done = std::min<int64_t>(counts[layer] / threads_[layer][c], blocks_[layer][c]);
    progress_[layer] = std::max(progress_[layer], done);
  }
  Publish(-1, false);
}

void StreamObj::Publish(int layer, bool queue) {
  const uint64_t seq = seq_.load(std::memory_order_relaxed);
  seq_.store(seq + 1, std::memory_order_relaxed);  // odd: a reader that overlaps this write reads again
  std::atomic_thread_fence(std::memory_order_release);
  const int layers = m_->num_layers();
  if (layer >= 0) pub_done_[layer].store(progress_[layer], std::memory_order_relaxed);
  if (layer == -1) {
    for (int i = 0; i < layers; ++i) pub_done_[i].store(progress_[i], std::memory_order_relaxed);
  }
  if (queue) {
    int rows = static_cast<int>(std::min<size_t>(requests_.size(), 1 + kMonitorLookahead));
    for (int r = 0; r < rows; ++r) {
      const std::vector<int>& ids = requests_[r]->candidate_ids;
      for (int i = 0; i < layers; ++i)
        pub_ids_[r * layers + i].store(ids.empty() ? 0 : ids[i], std::memory_order_relaxed);
    }
    pub_rows_.store(rows, std::memory_order_relaxed);
  }
  seq_.store(seq + 2, std::memory_order_release);
}

int StreamObj::CopyPublished(StreamSnapshot* out) const {
  const uint64_t before = seq_.load(std::memory_order_acquire);
  if (before & 1) return -1;
  const int layers = m_->num_layers();
  const int rows = pub_rows_.load(std::memory_order_relaxed);
  out->done.resize(rows > 0 ? layers : 0);  // (an idle stream: nothing else to read, no other core's lines to fetch)
  out->ids.resize(static_cast<size_t>(rows) * layers);
  for (size_t i = 0; i < out->done.size(); ++i) out->done[i] = pub_done_[i].load(std::memory_order_relaxed);
  for (size_t i = 0; i < out->ids.size(); ++i) out->ids[i] = pub_ids_[i].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (seq_.load(std::memory_order_relaxed) != before) return -1;
  out->rows = rows;
  return rows > 0 ? 1 : 0;
}

bool StreamObj::ReadState(StreamSnapshot* out) const {
  // a writer holds the stream's lock for a few hundred stores at most: a few tries, then wait for it on the lock
  constexpr int kTries = 64;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    if (int got = CopyPublished(out); got >= 0) return got == 1;
  }
  std::lock_guard<std::mutex> lock(mutex_);  // no writer now: every Publish runs under it
  return CopyPublished(out) == 1;
}

void StreamObj::RecordTimeline(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  timeline_on_ = on;
}

std::vector<LaunchRecord> StreamObj::Timeline() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timeline_;
}

std::vector<double> StreamObj::Latencies() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return latencies_;
}

void StreamObj::Close() {
  Resume();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  cond_.notify_all();
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // the destructor on the submitter itself: it returns without touching the stream
    } else {
      thread_.join();
    }
  }
  if (progress_thread_.joinable()) progress_thread_.join();
  m_->SetWaker(nullptr);
}

// ---- submitter -------------------------------------------------------------------------------

bool StreamObj::HasWork() const { return !requests_.empty() || !in_flight_.empty(); }

void StreamObj::SubmitLoop() {
  m_->device().PinThread();
  m_->device().SetThreadUnits(0);
  std::optional<Launch> next;  // synchronous: the launch StepSync already took (and marked running)
  while (true) {
    std::optional<Launch> launch;
    if (next) {
      launch.swap(next);
      StepSync(*launch, &next);
      continue;
    }
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!closed_ && !paused_locked() && !HasWork() &&
          !rest_.exchange(false, std::memory_order_relaxed)) {  // poll briefly: a request arriving soon starts at once
        lock.unlock();
        SpinUntil(
            [this] {
              return queued_.load(std::memory_order_acquire) > 0 || (source_ && pull_.load(std::memory_order_acquire));
            },
            options_.idle_spin_us);
        lock.lock();
      }
      // paused: wait without retiring anything (a drain decides what completed); nobody but this
      // thread holding the stream while it is idle means nobody can submit again: stop
      // gated: waiting for the switcher to prepare what the next launch needs (it wakes us)
      // closing: the queued requests still wait at a gate (no busy loop on the switcher)
      auto ready = [this] {
        return (closed_ && !HasWork()) ||
               ((closed_ || (!paused_locked() && HasWork())) && !(gated_ && in_flight_.empty())) ||
               undrained() ||  // a Preempt() that did not wait: this thread drains
               MayPull();
      };
      while (!cond_.wait_for(lock, std::chrono::milliseconds(100), ready)) {
        if (!HasWork() && use_count() == 1) closed_ = true;
        if (std::string stall = Stalled(); !stall.empty()) {  // the watchdog: no end to this wait in sight
          FailHead(stall);
          gated_ = false;
          break;
        }
      }
      if (closed_ && !HasWork()) {  // what the watchdog failed just now is delivered first
        lock.unlock();
        Deliver();
        return;
      }
      if (undrained()) {  // a Preempt() that did not wait: its drain, here
        DrainAsync();
        lock.unlock();
        cond_.notify_all();  // a waiting Preempt() or Resume()
        Deliver();
        continue;
      }
      if (paused_locked()) continue;  // closing while paused: Close() resumes first
      if (MayPull()) {
        lock.unlock();
        Deliver();  // what just ended (the watchdog's failure included) is delivered first
        Pull();
        continue;
      }
      if (!requests_.empty()) launch = NextLaunch();
      running_ = launch;  // preempt() waits until it is tracked (asynchronous) or returned (synchronous)
    }
    Deliver();
    if (async_ && launch) {
      LaunchAsync(*launch);
    } else if (async_) {
      RetireCompleted(true);
    } else if (launch) {
      StepSync(*launch, &next);
    }
  }
}

std::optional<Launch> StreamObj::NextLaunch() {
  while (true) {
    if (async_ && static_cast<int>(in_flight_.size()) >= options_.max_in_flight) return std::nullopt;
    if (!rerun_.empty()) {
      if (!MayLaunch(rerun_.front())) return std::nullopt;
      Launch launch = rerun_.front();
      rerun_.erase(rerun_.begin());
      return launch;
    }
    if (requests_.empty() || next_layer_ >= m_->num_layers()) return std::nullopt;  // waiting for in-flight ones
    if (next_layer_ == 0) {
      if (!m_->placement()->Acquire(m_, -1)) {  // its environment (switching stage 1) is not prepared
        if (Gate(-1)) continue;
        return std::nullopt;
      }
      if (!StartRequest()) continue;  // a bad request failed alone; try the next
    }
    const auto& ids = requests_.front()->candidate_ids;
    Launch launch{request_ids_, next_layer_, ids.empty() ? 0 : ids[next_layer_]};
    if (!MayLaunch(launch)) return std::nullopt;
    if (!m_->placement()->Acquire(m_, m_->group_of(next_layer_))) {
      if (Gate(m_->group_of(next_layer_))) continue;
      return std::nullopt;
    }
    ++next_layer_;
    return launch;
  }
}

bool StreamObj::MayLaunch(const Launch& launch) const {
  // asynchronous: a non-idempotent kernel waits until all earlier work is done, so its inputs are final
  return !(async_ && !in_flight_.empty() && !idempotent(launch));
}

bool StreamObj::Gate(int group) {
  std::string error = m_->placement_error();
  if (!error.empty()) {  // it cannot be prepared: its requests fail, the other models go on
    FailHead(error);
    return true;
  }
  if (!gated_ || gated_group_ != group) gated_since_us_ = Device::NowMicros();
  gated_ = true;
  gated_group_ = group;  // (Acquire asked the placement for it)
  return false;
}

std::string StreamObj::Stalled() const {
  if (!gated_ || paused_locked() || requests_.empty() || !in_flight_.empty() || options_.stall_timeout_s <= 0)
    return "";
  double waited_s = (Device::NowMicros() - gated_since_us_) / 1e6;
  if (waited_s < options_.stall_timeout_s) return "";
  std::ostringstream text;
  text << "model " << m_->name() << ": a request waited " << static_cast<int64_t>(waited_s) << " s for "
       << (gated_group_ < 0
               ? std::string("its environment to be prepared (switching stage 1, or a streamed model's turn)")
               : "its sub-task " + std::to_string(gated_group_) +
                     " to be switched in (switching stage 2: device memory)")
       << " and was failed by the watchdog (stall timeout " << options_.stall_timeout_s << " s)";
  return text.str();
}

void StreamObj::EndRequest() {
  m_->users.fetch_sub(1);
  m_->placement()->EndRequest(m_);
  if (source_ && requests_.empty()) pull_.store(true, std::memory_order_release);  // its source may have more
}

bool StreamObj::StartRequest() {
  Request& request = requests_.front();
  if (std::string quarantined = m_->quarantined(); !quarantined.empty()) {  // queued before the quarantine
    FailHead(quarantined);
    return false;
  }
  if (request->deadline_us > 0 && request->started_us == 0) {  // the clock is read only for a request with one
    if (double now = Device::NowMicros(); now > request->deadline_us) {
      std::ostringstream text;
      text << "model " << m_->name() << ": the request did not start within its deadline (queued "
           << static_cast<int64_t>(now - request->submitted_us) << " us, "
           << static_cast<int64_t>(now - request->deadline_us) << " us past it)";
      FailHead(text.str());
      return false;
    }
  }
  run_generation_ = m_->device().generation();
  try {
    m_->CopyInputs(request->inputs);  // checked by Submit
  } catch (const ffi::Error& err) {
    FailHead(OneLine(err.message()));
    return false;
  }
  request->started_us = Device::NowMicros();
  request->id = ++request_ids_;  // the id its launches and timeline records carry
  if (m_->counts_progress()) m_->ResetProgress();
  std::fill(progress_.begin(), progress_.end(), 0);
  Publish(-1, false);
  return true;
}

void StreamObj::StepSync(const Launch& launch, std::optional<Launch>* next) {
  m_->ClearStarted();
  double start = timeline_on_ ? Device::NowMicros() : 0;
  std::string error;
  bool stale = false;    // the device recovered from a fault since the head request started: it starts again
  bool refused = false;  // the device was lost: the launch never entered it
  Device& device = m_->device();
  try {
    stale = device.EnterLaunch(options_.recovery_timeout_s) != run_generation_;  // parks while the device recovers
    try {
      if (!stale) m_->RunLayer(launch.layer, launch.candidate);
    } catch (const std::exception& err) {
      error = err.what();
      if (auto* ffi_err = dynamic_cast<const ffi::Error*>(&err)) error = ffi_err->message();
    }
    device.ExitLaunch();
  } catch (const ffi::Error& err) {  // the device is lost, or did not recover in time
    error = err.message();
    refused = device.health() == Device::kLost;
  }
  if (!error.empty()) {
    if (std::string fault = HandleFault(launch, error); !fault.empty()) error = fault;
  }
  bool deliver, wake;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_.reset();
    ++launches;
    bool flagged = flagged_launch_ || m_->preempt_flag_set();  // not the flag alone: a Resume() may have cleared it
    flagged_launch_ = false;
    if (stale) {
      RestartHead();
    } else if (!error.empty()) {
      FailHead(OneLine(error), refused);
    } else if (flagged && !(!idempotent(launch) && m_->started())) {
      rerun_.push_back(launch);  // aborted (or skipped at entry): run it again on resume
      ++reruns;
    } else {
      if (timeline_on_) launched_at_[{launch.request, launch.layer, launch.candidate}] = start;
      Retire(launch, timeline_on_ ? Device::NowMicros() : 0);
    }
    // take the next launch in the same critical section (one lock per launch on the hot path)
    if (!paused_locked() && !requests_.empty()) {
      *next = NextLaunch();
      running_ = *next;
    }
    deliver = !done_.empty();
    wake = preempt_waiting_ > 0;
  }
  if (wake) cond_.notify_all();
  if (deliver) Deliver();
}

void StreamObj::LaunchAsync(const Launch& launch) {
  double start = Device::NowMicros();
  EventHandle event = nullptr;
  std::string error;
  bool stale = false;    // the device recovered from a fault since the head request started (CPU asynchronous mode;
                         // a CUDA device is not recovered: after a fault it is lost)
  bool refused = false;  // the device was lost: the launch never entered it
  Device& device = m_->device();
  try {
    stale = device.EnterLaunch(options_.recovery_timeout_s) != run_generation_;
    try {
      if (!stale) {
        if (!idempotent(launch)) m_->ClearStarted();  // launched alone (MayLaunch): its entry check marks it
        m_->RunLayer(launch.layer, launch.candidate);
        event = m_->RecordEvent();
      }
    } catch (const ffi::Error& err) {
      error = err.message();
    }
    device.ExitLaunch();
  } catch (const ffi::Error& err) {
    error = err.message();
    refused = device.health() == Device::kLost;
  }
  if (!error.empty()) {
    if (std::string fault = HandleFault(launch, error); !fault.empty()) error = fault;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_.reset();
    ++launches;
    if (stale) {
      DiscardInFlight();
      RestartHead();
    } else if (!error.empty()) {
      FailHead(OneLine(error), refused);
    } else {
      if (timeline_on_) launched_at_[{launch.request, launch.layer, launch.candidate}] = start;
      in_flight_.emplace_back(launch, event);
    }
  }
  cond_.notify_all();
  Deliver();
}

void StreamObj::DiscardInFlight() {
  try {
    m_->Synchronize();
  } catch (const ffi::Error&) {  // the request starts again: what its old launches did is void
  }
  for (auto& [launch, event] : in_flight_) {
    m_->device().FreeEvent(event);
    launched_at_.erase({launch.request, launch.layer, launch.candidate});
  }
  in_flight_.clear();
}

void StreamObj::RetireCompleted(bool wait_oldest) {
  EventHandle oldest = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_flight_.empty()) return;
    oldest = in_flight_.front().second;
    waiting_ = wait_oldest;  // preempt() waits for this wait to end before it drains
  }
  // window full or nothing to launch: block on the oldest launch, outside the lock
  if (wait_oldest) m_->device().WaitEvent(oldest);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_ = false;
    while (!in_flight_.empty() && !paused_locked() && m_->device().EventDone(in_flight_.front().second)) {
      auto [launch, event] = in_flight_.front();
      in_flight_.pop_front();
      m_->device().FreeEvent(event);
      Retire(launch, Device::NowMicros());
    }
  }
  cond_.notify_all();
  Deliver();
}

std::vector<Launch> StreamObj::DrainAsync() {
  // with the flag set: wait for the in-flight launches; idempotent ones run again, others finished
  bool resume = state_ == RunState::kResumeAfterDrain;  // a Resume(wait=false) came before this drain
  To(RunState::kPaused);
  std::vector<Launch> finished;
  std::string error;
  try {
    m_->Synchronize();               // every launch in flight has ended
  } catch (const ffi::Error& err) {  // a launch failed: its request fails once the drain is done
    error = OneLine(err.message());
  }
  // a non-idempotent kernel that checks at its entry (CPU) and saw the flag did nothing: it runs again
  bool skipped_entry = m_->device().entry_checks() && !m_->started();
  while (!in_flight_.empty()) {
    auto [launch, event] = in_flight_.front();
    in_flight_.pop_front();
    m_->device().FreeEvent(event);
    if (idempotent(launch) || skipped_entry) {
      rerun_.push_back(launch);
      ++reruns;
      launched_at_.erase({launch.request, launch.layer, launch.candidate});
    } else {
      finished.push_back(launch);
      Retire(launch, Device::NowMicros());
    }
  }
  std::sort(rerun_.begin(), rerun_.end(), [](const Launch& a, const Launch& b) {
    return std::tie(a.request, a.layer) < std::tie(b.request, b.layer);
  });
  if (!error.empty() && !requests_.empty()) FailHead(error);
  if (resume && state_ == RunState::kPaused) Unpause();
  return finished;
}

void StreamObj::Retire(const Launch& launch, double end_us) {
  // a launch completed; finishing the last layer completes the head request
  auto key = std::make_tuple(launch.request, launch.layer, launch.candidate);
  auto found = launched_at_.find(key);
  if (found != launched_at_.end()) {
    timeline_.push_back({launch.request, launch.layer, launch.candidate, found->second, end_us});
    launched_at_.erase(found);
  }
  progress_[launch.layer] = blocks_[launch.layer][launch.candidate];
  Publish(launch.layer, false);
  if (int g = m_->group_of(launch.layer); launch.layer == m_->group_layers(g).second && rerun_.empty()) {
    // stamped before the sub-task becomes kFinished: its placement may take it back at once
    m_->placement()->Release(m_, g, Device::NowMicros());
  }
  if (launch.layer != m_->num_layers() - 1 || !rerun_.empty()) return;
  Request request = requests_.front();
  requests_.pop_front();
  queued_.fetch_sub(1, std::memory_order_relaxed);
  next_layer_ = 0;
  std::fill(progress_.begin(), progress_.end(), -1);
  Publish(-1, true);
  try {
    done_.push_back({request, {m_->GetOutputs(), ""}});
    ++completed;
    busy_us.fetch_add(static_cast<int64_t>(Device::NowMicros() - request->started_us), std::memory_order_relaxed);
  } catch (const ffi::Error& err) {
    done_.push_back({request, {{}, OneLine(err.message())}});
    ++failed;
  }
  EndRequest();
  PauseAfterRequest();
}

void StreamObj::FailHead(const std::string& error, bool device_lost) {
  Request request = requests_.front();
  request->device_lost = device_lost;
  requests_.pop_front();
  queued_.fetch_sub(1, std::memory_order_relaxed);
  next_layer_ = 0;
  std::fill(progress_.begin(), progress_.end(), -1);
  Publish(-1, true);
  rerun_.clear();
  done_.push_back({request, {{}, error}});
  ++failed;
  EndRequest();
  PauseAfterRequest();
}

void StreamObj::RestartHead() {
  if (requests_.empty()) return;
  Request& head = requests_.front();
  if (head->restarts++ >= 1) {
    FailHead("model " + m_->name() +
             ": the device recovered from a fault twice while this request ran; it is not "
             "run a third time");
    return;
  }
  ++fault_restarts;
  next_layer_ = 0;  // StartRequest runs again: inputs copied anew, a new request number, progress from 0
  rerun_.clear();
  std::fill(progress_.begin(), progress_.end(), -1);
  Publish(-1, false);
}

std::string StreamObj::HandleFault(const Launch& launch, const std::string& error) {
  Device& device = m_->device();
  if (device.health() != Device::kFaulted) return "";  // an ordinary error, or the device was lost before
  // this launch's fault (on the CPU device only an injected fault reports; on CUDA the tenant whose call saw the
  // sticky error first): the device recovers on this thread once the other launches running have ended
  ++faults;
  std::string lost = device.Recover(options_.recovery_timeout_s);
  std::ostringstream text;
  text << "model " << m_->name() << ": layer " << launch.layer << " (candidate " << launch.candidate << ") faulted on "
       << device.kind() << ": " << OneLine(error);
  if (lost.empty()) {
    text << "; the device recovered in " << static_cast<int64_t>(device.faults().last_recovery_s * 1e3 + 0.5)
         << " ms and the other tenants' requests run again";
  } else {
    text << "; the device is lost: " << lost;
  }
  std::string quarantined = m_->RecordFault(options_.fault_limit, options_.fault_window_s);
  if (!quarantined.empty()) text << "; " << quarantined;
  return text.str();
}

void StreamObj::Deliver() {
  // resolve finished requests outside the lock (their callbacks may preempt or resume)
  while (true) {
    Done item;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (done_.empty()) return;
      item = std::move(done_.front());
      done_.pop_front();
    }
    double now = Device::NowMicros();
    if (item.second.second.empty()) {  // counted before the waiter wakes, so stats include it
      std::lock_guard<std::mutex> lock(mutex_);
      // the latest ones only (a server runs for long): past kMaxLatencies the oldest half goes
      if (latencies_.size() >= kMaxLatencies)
        latencies_.erase(latencies_.begin(), latencies_.begin() + kMaxLatencies / 2);
      latencies_.push_back(now - item.first->submitted_us);
    }
    item.first->Finish(std::move(item.second.first), ffi::String(item.second.second), now);
  }
}

void StreamObj::ProgressLoop() {
  m_->device().SetThreadUnits(0);
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cond_.wait_for(lock, std::chrono::duration<double, std::milli>(options_.progress_interval_ms),
                     [this] { return closed_; });
      if (closed_) return;
      if (requests_.empty()) continue;
    }
    try {
      SyncProgress();
    } catch (const ffi::Error&) {  // the bitmap still advances as launches complete
      return;
    }
  }
}

}  // namespace tvmsched
