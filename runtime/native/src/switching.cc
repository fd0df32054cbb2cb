// Mechanism C (PipeSwitch-style switching): the stage threads and the pipeline rules of
// tvmsched/switching.h. Decisions are taken under `mu_`; device work (stage 1, stage 2, cleaning)
// runs outside it; streams are woken outside it (their hooks call in under their own locks).
#include "tvmsched/switching.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_set>

#include "error_line.h"

namespace tvmsched {

/*! \brief The staged placement of the registered models of one switcher (and the switcher's threads). */
class SwitcherCore : public Placement {
 public:
  SwitcherCore(std::shared_ptr<Device> device, SwitchOptions options) : device_(std::move(device)), options_(options) {
    if (options_.preset_count < 1) TVM_FFI_THROW(TvmschedError) << "the preset count must be at least 1";
    Device::MemoryStats stats = device_->memory();
    if (!options_.budget && options_.scope) options_.budget = options_.scope->budget();
    if (!options_.budget) options_.budget = stats.budget ? stats.budget : InUse() + device_->FreeMemory();
    if (options_.scope && options_.scope->budget() && options_.budget > options_.scope->budget()) {
      TVM_FFI_THROW(TvmschedError) << "a switching budget of " << options_.budget
                                   << " bytes is above its runtime's budget of " << options_.scope->budget()
                                   << " bytes";
    }
    if (stats.budget && options_.budget > stats.budget) {
      TVM_FFI_THROW(TvmschedError) << "a switching budget of " << options_.budget
                                   << " bytes is above the device's budget of " << stats.budget << " bytes";
    }
    if (!options_.threshold1) options_.threshold1 = options_.budget / 4;
    if (!options_.threshold2) options_.threshold2 = options_.budget;
  }

  void Start() {
    env_thread_ = std::thread([this] { EnvLoop(); });
    memory_thread_ = std::thread([this] { MemoryLoop(); });
  }

  void Close() {
    std::vector<ModelObj*> woken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      stop_ = true;
      for (auto& [m, e] : entries_) woken.push_back(m);
    }
    cond_.notify_all();
    if (env_thread_.joinable()) env_thread_.join();
    if (memory_thread_.joinable()) memory_thread_.join();
    for (ModelObj* m : woken) {  // requests still waiting for a switch fail; the models stay loaded
      if (!m->resident()) m->SetPlacementError("model " + m->name() + " is not resident and its switcher is closed");
      m->Wake();
    }
    std::lock_guard<std::mutex> lock(mu_);
    queue_.clear();
    entries_.clear();  // the models hold this core; it lets go of them (no cycle)
    blocked_.clear();
    reported_.clear();
    room_refused_.clear();
    options_.room = nullptr;              // its runtime's callback is not asked after Close
    blocked_callback_ = ffi::Function();  // a Python callback may hold its Runtime
  }

  void Add(Model model, const std::shared_ptr<SwitcherCore>& self) {
    ModelObj* m = model.get();
    if (&m->device() != device_.get()) TVM_FFI_THROW(TvmschedError) << "model " << m->name() << " is on another device";
    if (m->placement()->on_demand()) TVM_FFI_THROW(TvmschedError) << "model " << m->name() << " already has a switcher";
    if (m->scope() != options_.scope) {
      TVM_FFI_THROW(TvmschedError) << "model " << m->name()
                                   << " counts against another memory budget than its switcher's";
    }
    if (!m->registered()) {
      TVM_FFI_THROW(TvmschedError) << "model " << m->name()
                                   << " was loaded resident; a switcher takes registered models";
    }
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_[m];
    e.model = std::move(model);
    e.m = m;
    e.finished.assign(m->num_groups(), false);
    e.exec_start.assign(m->num_groups(), 0);
    m->SetPlacement(self);
  }

  bool Prefetch(ModelObj* m) {
    size_t need = m->env_bytes();
    {
      std::lock_guard<std::mutex> lock(mu_);
      Entry& e = Find(m);
      if (e.env != kEnvNone || InQueue(m)) return m->resident();
      for (int g = 0; g < m->num_groups(); ++g) need += m->group_bytes(g);
      if (InUse() + need > options_.budget) return false;
      e.env = kEnvPreparing;
      for (int g = 0; g < m->num_groups(); ++g) m->SetGroupState(g, kPreparing);
    }
    double start = Device::NowMicros();
    try {
      m->PrepareEnvironment();
      Record(m, "stage1", -1, start, static_cast<int64_t>(m->env_bytes()));
      for (int g = 0; g < m->num_groups(); ++g) {
        double t = Device::NowMicros();
        m->PrepareGroup(g, nullptr);
        Record(m, "stage2", g, t, static_cast<int64_t>(m->group_bytes(g)));
      }
    } catch (...) {
      std::vector<bool> none(m->num_groups(), false);
      for (int g = 0; g < m->num_groups(); ++g) {
        m->SetGroupState(g, kAbsent);
        m->CleanGroup(g, none);
      }
      m->CleanEnvironment();
      std::lock_guard<std::mutex> lock(mu_);
      Find(m).env = kEnvNone;
      // the memory it found was taken meanwhile (a switch of another model): it stays registered
      if (InUse() + need > options_.budget) return false;
      throw;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      Entry& e = Find(m);
      e.env = kEnvReady;
      e.last_used = ++clock_;
      for (int g = 0; g < m->num_groups(); ++g) m->SetGroupState(g, kReady);
    }
    cond_.notify_all();
    return true;
  }

  /*! \brief Evict an idle model now (the memory thread does it; this waits): its sub-tasks, and its
   *  environment too unless `keep_env`. False when it is in use or switching. */
  bool Evict(ModelObj* m, bool keep_env) {
    std::unique_lock<std::mutex> lock(mu_);
    Find(m);
    if (InQueue(m) || m->users.load() > 0) return false;
    uint64_t ticket = ++evict_tickets_;
    evictions_.push_back({m, keep_env, ticket});
    cond_.notify_all();
    cond_.wait(lock, [&] { return stop_ || evicted_ >= ticket; });
    return !stop_;
  }

  bool Remove(ModelObj* m) {
    if (!Evict(m, /*keep_env=*/false)) return false;  // in use, or the switcher is closed
    std::lock_guard<std::mutex> lock(mu_);
    queue_.erase(std::remove(queue_.begin(), queue_.end(), m), queue_.end());
    reported_.erase(m);
    room_refused_.erase(m);
    entries_.erase(m);  // its Model reference goes: the model is freed with its last one
    return true;
  }

  std::vector<StageEvent> Events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

  const SwitchOptions& options() const { return options_; }

  const char* kind() const override { return "staged"; }

  // ---- Placement: called by streams under their locks ------------------------------------------
  void Demand(ModelObj* m, int /*group*/) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = entries_.find(m);
    if (stop_ || found == entries_.end() || found->second.env == kEnvFailed) return;
    if (!InQueue(m)) queue_.push_back(m);
    found->second.switching = true;
    cond_.notify_all();
  }

  void GroupStarted(ModelObj* m, int g) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = entries_.find(m);
    if (found == entries_.end()) return;
    found->second.running = true;
    found->second.exec_start[g] = Device::NowMicros();
    NotifyStages();
  }

  void GroupFinished(ModelObj* m, int g, double end_us) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = entries_.find(m);
    if (found == entries_.end()) return;
    found->second.finished[g] = true;
    if (found->second.switching)
      Push({m->name(), "exec", g, found->second.exec_start[g], end_us, 0});  // a switch's execution
    NotifyStages();
  }

  void Yield(ModelObj* m) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto found = entries_.find(m); found != entries_.end()) found->second.paused = true;
    // a paused task at the head would keep every task behind it waiting (the preset-count rule counts its
    // unexecuted sub-tasks); it keeps what it holds, and its stream demands again when it resumes
    queue_.erase(std::remove(queue_.begin(), queue_.end(), m), queue_.end());
    cond_.notify_all();
  }

  void Resumed(ModelObj* m) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto found = entries_.find(m); found != entries_.end()) found->second.paused = false;
    reported_.clear();  // a wait it holds up again later is reported again
    NotifyStages();
  }

  /*! \brief Called (on the memory thread, outside the switcher's lock) with a model whose switch-in waits for
   *  memory that only paused streams' started requests hold, and those models' names: nothing will free it until
   *  their streams run. Reported once per wait. The mechanism only tells; a policy decides (FinishStarted). */
  void SetBlockedCallback(ffi::Function callback) {
    std::lock_guard<std::mutex> lock(mu_);
    blocked_callback_ = std::move(callback);
  }

  void RequestFinished(ModelObj* m) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = entries_.find(m);
    if (found == entries_.end()) return;
    Entry& e = found->second;
    e.last_used = ++clock_;
    e.running = false;
    e.switching = false;
    std::fill(e.finished.begin(), e.finished.end(), false);
    reported_.erase(m);  // its wait (if any) is over
    room_refused_.erase(m);
    bool queued = InQueue(m);
    queue_.erase(std::remove(queue_.begin(), queue_.end(), m), queue_.end());  // its task is over
    if (queued) {
      cond_.notify_all();
    } else {
      NotifyStages();
    }
  }

 private:
  /*! \brief Wake the stage threads for a request's progress only when they may act on it (a switch-in queued,
   *  an eviction asked for, or finished sub-tasks to clean): a resident model's request does not wake them
   *  (17 wake-ups of two threads per request of a 64-layer chain cost ~30 µs on 2 cores; issue 28, item 4). */
  void NotifyStages() {
    if (!queue_.empty() || !evictions_.empty() || !options_.retain) cond_.notify_all();
  }

  enum EnvState { kEnvNone, kEnvPreparing, kEnvReady, kEnvFailed };
  struct Entry {
    Model model;
    ModelObj* m = nullptr;
    EnvState env = kEnvNone;
    uint64_t last_used = 0;
    bool running = false;        // a request is executing (a group started, the request not finished)
    bool paused = false;         // its stream is paused (preempted) and has not resumed
    std::vector<bool> finished;  // groups the running request has executed
    bool switching = false;      // the running request demanded a switch-in: its groups' runs are the switch's
                                 // execution, also after a preemption took it out of the queue
    std::vector<double> exec_start;
  };
  enum ActionKind { kNone, kPrepare, kClean, kEvict, kFail, kRoom };
  struct Action {
    ActionKind kind = kNone;
    ModelObj* m = nullptr;
    std::vector<int> groups;
    std::string error;
    bool drop_env = false;  // an eviction asked for: the environment goes too
    uint64_t ticket = 0;    // ... and its caller waits for this
    size_t need = 0;        // kRoom: the bytes to ask options_.room for
  };

  Entry& Find(ModelObj* m) {
    auto found = entries_.find(m);
    if (found == entries_.end())
      TVM_FFI_THROW(TvmschedError) << "model " << m->name() << " is not registered with this switcher";
    return found->second;
  }
  bool InQueue(ModelObj* m) const { return std::find(queue_.begin(), queue_.end(), m) != queue_.end(); }

  void Record(ModelObj* m, const char* stage, int group, double start, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    Push({m->name(), stage, group, start, Device::NowMicros(), bytes});
  }

  /*! \brief Keep an event (under mu_); the oldest half goes past kMaxEvents (a server runs for long). */
  void Push(StageEvent event) {
    if (events_.size() >= kMaxEvents) events_.erase(events_.begin(), events_.begin() + kMaxEvents / 2);
    events_.push_back(std::move(event));
  }
  static constexpr size_t kMaxEvents = 1 << 16;

  /*! \brief Bytes of the sub-tasks of switching models (queued tasks) that are prepared or running. */
  size_t ActiveBytes() const {
    size_t bytes = 0;
    for (ModelObj* m : queue_) {
      for (int g = 0; g < m->num_groups(); ++g) {
        GroupState s = m->group_state(g);
        if (s != kAbsent) bytes += m->group_bytes(g);
      }
    }
    return bytes;
  }

  size_t RunningBytes() const {
    size_t bytes = 0;
    for (const auto& [m, e] : entries_) {
      for (int g = 0; g < m->num_groups(); ++g) {
        if (m->group_state(g) == kLeased) bytes += m->group_bytes(g);
      }
    }
    return bytes;
  }

  /*! \brief Environments prepared ahead: ready or preparing, of models that are not the current task. */
  size_t AheadEnvBytes() const {
    size_t bytes = 0;
    for (const auto& [m, e] : entries_) {
      if ((e.env == kEnvReady || e.env == kEnvPreparing) && (queue_.empty() || queue_.front() != m))
        bytes += m->env_bytes();
    }
    return bytes;
  }

  /*! \brief Groups the running request of `e` still has to execute (they keep their inputs). */
  std::vector<bool> Pending(const Entry& e) const {
    std::vector<bool> pending(e.m->num_groups(), false);
    if (e.running) {
      for (int g = 0; g < e.m->num_groups(); ++g) pending[g] = !e.finished[g];
    }
    return pending;
  }

  /*! \brief Finished sub-tasks taken back for cleaning (kFinished -> kAbsent), of `only` or of any model. */
  Action TakeFinished(ModelObj* only) {
    for (auto& [m, e] : entries_) {
      if (only && m != only) continue;
      Action action{kClean, m, {}, ""};
      for (int g = 0; g < m->num_groups(); ++g) {
        if (m->group_state(g) == kFinished && m->CasGroup(g, kFinished, kAbsent)) action.groups.push_back(g);
      }
      if (!action.groups.empty()) return action;
    }
    return {};
  }

  /*! \brief A model with prepared sub-tasks to take back for `head`: the least recently used idle one (no requests,
   *  not switching), else one whose queued requests have not started (prepared ahead, or paused before its first
   *  launch: its stream demands them again). A request that started keeps what it holds. */
  Action TakeVictim(ModelObj* head) {
    Entry* victim = nullptr;
    bool victim_idle = false;
    for (auto& [m, e] : entries_) {
      if (m == head || e.running) continue;
      bool holds = false;  // held sub-tasks too: prepared ahead for a task that was paused since (it left the queue)
      for (int g = 0; g < m->num_groups(); ++g) {
        GroupState s = m->group_state(g);
        holds |= s == kReady || s == kFinished || s == kHeld;
      }
      if (!holds) continue;
      bool idle = !InQueue(m) && m->users.load() == 0;
      if (!victim || (idle && !victim_idle) || (idle == victim_idle && e.last_used < victim->last_used)) {
        victim = &e;
        victim_idle = idle;
      }
    }
    if (!victim) return {};
    return TakeBack(victim->m);
  }

  /*! \brief The environment of the least recently used idle model that holds nothing else (evicted with its
   *  environment kept, for a fast switch back): taken back when `head` has no room, else nothing. */
  Action TakeIdleEnvironment(ModelObj* head) {
    Entry* victim = nullptr;
    for (auto& [m, e] : entries_) {
      if (m == head || e.running || e.env != kEnvReady || InQueue(m) || m->users.load() > 0) continue;
      bool holds = false;
      for (int g = 0; g < m->num_groups(); ++g) holds |= m->group_state(g) != kAbsent;
      if (holds) continue;
      if (!victim || e.last_used < victim->last_used) victim = &e;
    }
    if (!victim) return {};
    Action action{kEvict, victim->m, {}, ""};
    action.drop_env = true;
    return action;
  }

  /*! \brief Bytes of `m`'s sub-tasks before `g` that are prepared or running: its request runs them before g and
   *  they are cleaned as they finish, so a switch-in of g that waits for memory is not stuck while they exist. */
  size_t EarlierBytes(ModelObj* m, int g) const {
    size_t bytes = 0;
    for (int h = 0; h < g; ++h) {
      GroupState s = m->group_state(h);
      if (s == kReady || s == kLeased || s == kFinished) bytes += m->group_bytes(h);
    }
    return bytes;
  }

  /*! \brief Bytes of the prepared sub-tasks of other models whose request started: they give them back when it ends. */
  size_t StartedBytes(ModelObj* except) const {
    size_t bytes = 0;
    for (const auto& [m, e] : entries_) {
      if (!e.running || m == except) continue;
      for (int g = 0; g < m->num_groups(); ++g) {
        if (m->group_state(g) != kAbsent) bytes += m->group_bytes(g);
      }
    }
    return bytes;
  }

  /*! \brief An eviction of `m`: its prepared sub-tasks taken back (kReady/kFinished/kHeld -> kAbsent). */
  Action TakeBack(ModelObj* m) {
    Action action{kEvict, m, {}, ""};
    for (int g = 0; g < m->num_groups(); ++g) {
      for (GroupState from : {kReady, kFinished, kHeld}) {
        if (m->CasGroup(g, from, kAbsent)) action.groups.push_back(g);
      }
    }
    return action;
  }

  /*! \brief Held sub-tasks of queued tasks behind the head (prepared ahead, not running): taken back. */
  Action TakeHeld() {
    for (size_t i = 1; i < queue_.size(); ++i) {
      ModelObj* m = queue_[i];
      Action action{kClean, m, {}, ""};
      for (int g = 0; g < m->num_groups(); ++g) {
        if (m->CasGroup(g, kHeld, kAbsent)) action.groups.push_back(g);
      }
      if (!action.groups.empty()) return action;
    }
    return {};
  }

  /*! \brief Stage 2 of `g` of `m` if memory allows; else what frees memory; else nothing (wait). */
  Action TryPrepare(ModelObj* m, int g, bool next_task) {
    size_t need = m->GroupNeed(g);
    size_t in_use = InUse();
    bool t2_ok = ActiveBytes() + m->group_bytes(g) <= options_.threshold2 || ActiveBytes() == 0;
    if (t2_ok && in_use + need <= options_.budget) {
      m->SetGroupState(g, kPreparing);
      return {kPrepare, m, {g}, ""};
    }
    if (next_task) return {};  // the next task never evicts or cleans for its head start
    if (in_use + need > options_.budget) {
      if (Action a = TakeVictim(m); a.kind != kNone) return a;
      if (Action a = TakeIdleEnvironment(m); a.kind != kNone) return a;
    }
    if (Action a = TakeFinished(nullptr); a.kind != kNone) return a;
    if (Action a = TakeHeld(); a.kind != kNone) return a;
    if (m->env_bytes() + need > options_.budget) {
      std::ostringstream text;
      text << "model " << m->name() << " cannot run within the memory budget: its sub-task " << g << " needs " << need
           << " bytes and its environment " << m->env_bytes() << " bytes; the budget is " << options_.budget
           << " bytes";
      return {kFail, m, {}, text.str()};
    }
    // nothing will free memory (no other started request holds any, and none of m's own sub-tasks before g is
    // still to run and be cleaned): no end to a wait
    if (in_use + need > options_.budget && RunningBytes() == 0 && StartedBytes(m) == 0 && EarlierBytes(m, g) == 0 &&
        !Busy()) {
      if (options_.room && !room_refused_.count(m)) return {kRoom, m, {}, "", false, 0, need};
      std::ostringstream text;
      text << "model " << m->name() << " cannot be switched in: its sub-task " << g << " needs " << need << " bytes; "
           << in_use << " of the budget of " << options_.budget
           << " bytes are held by memory no request of its runtime "
           << "will free (models loaded resident, streamed models, or models of another switcher)" << Holders();
      return {kFail, m, {}, text.str()};
    }
    if (in_use + need > options_.budget) NoteBlocked(m);
    return {};  // wait: running requests finish and free memory
  }

  /*! \brief `m` waits for memory: when only paused streams' started requests hold what would free it (nothing
   *  else runs or is being prepared), note them for the blocked callback, once per wait. */
  void NoteBlocked(ModelObj* m) {
    if (!blocked_callback_.defined() || Busy()) return;
    ffi::Array<Model> holders;
    for (const auto& [other, e] : entries_) {
      if (other == m) continue;
      bool holds = e.running;
      for (int g = 0; g < other->num_groups() && !holds; ++g) holds = other->group_state(g) == kLeased;
      if (!holds) continue;
      if (!e.paused) return;  // a request that runs will free memory: wait for it
      holders.push_back(e.model);
    }
    if (holders.empty() || !reported_.insert(m).second) return;
    blocked_.push_back({entries_.at(m).model, std::move(holders)});
  }

  /*! \brief What frees memory for the current task's environment (stage 1), else nothing (wait), else its failure. */
  Action RoomForEnvironment(ModelObj* m) {
    if (Action a = TakeVictim(m); a.kind != kNone) return a;
    if (Action a = TakeIdleEnvironment(m); a.kind != kNone) return a;
    if (Action a = TakeFinished(nullptr); a.kind != kNone) return a;
    if (Action a = TakeHeld(); a.kind != kNone) return a;
    if (RunningBytes() == 0 && StartedBytes(m) == 0 && !Busy()) {
      if (options_.room && !room_refused_.count(m)) return {kRoom, m, {}, "", false, 0, m->env_bytes()};
      std::ostringstream text;
      text << "model " << m->name() << " cannot be switched in: its environment needs " << m->env_bytes() << " bytes; "
           << InUse() << " of the budget of " << options_.budget
           << " bytes are held by memory no request of its runtime "
           << "will free (models loaded resident, streamed models, or models of another switcher)";
      return {kFail, m, {}, text.str()};
    }
    NoteBlocked(m);
    return {};
  }

  /*! \brief "; held: NAME (queued, running, paused, users U, environment E, sub-tasks S...) ..." for a failure line:
   *  what each switched model holds and why it is not taken back. */
  std::string Holders() const {
    std::ostringstream text;
    text << "; held:";
    for (const auto& [m, e] : entries_) {
      text << " " << m->name() << " (" << (InQueue(m) ? "queued, " : "") << (e.running ? "running, " : "")
           << (e.paused ? "paused, " : "") << "users " << m->users.load() << ", environment " << e.env << ", sub-tasks";
      for (int g = 0; g < m->num_groups(); ++g) text << " " << m->group_state(g);
      text << ")";
    }
    return text.str();
  }

  /*! \brief Bytes in use by the switched models' budget: their scope's, else the whole device's. */
  size_t InUse() const { return options_.scope ? options_.scope->in_use() : device_->memory().in_use; }

  /*! \brief Whether an environment or a sub-task is being prepared (its failure would give memory back). */
  bool Busy() const {
    for (const auto& [m, e] : entries_) {
      if (e.env == kEnvPreparing) return true;
      for (int g = 0; g < m->num_groups(); ++g) {
        if (m->group_state(g) == kPreparing) return true;
      }
    }
    return false;
  }

  /*! \brief The next thing for the memory thread (under mu_). */
  Action Decide(std::vector<ModelObj*>* wake) {
    // held sub-tasks of the next task: run now if their task leads or the rule allows
    for (size_t i = 0; i < queue_.size(); ++i) {
      ModelObj* m = queue_[i];
      for (int g = 0; g < m->num_groups(); ++g) {
        if (m->group_state(g) != kHeld) continue;
        if (i == 0 || m->group_bytes(g) + RunningBytes() <= options_.threshold2) {
          m->SetGroupState(g, kReady);
          wake->push_back(m);
        }
      }
    }
    if (!evictions_.empty()) {  // asked for by Evict (a model in use or switching keeps its sub-tasks)
      EvictRequest request = evictions_.front();
      evictions_.pop_front();
      bool idle = !InQueue(request.m) && request.m->users.load() == 0;
      Action action = idle ? TakeBack(request.m) : Action{kEvict, request.m, {}, ""};
      action.drop_env = !request.keep_env;
      action.ticket = request.ticket;
      return action;
    }
    if (!options_.retain) {
      if (Action a = TakeFinished(nullptr); a.kind != kNone) return a;
    }
    while (!queue_.empty()) {
      ModelObj* head = queue_.front();
      Entry& h = entries_.at(head);
      if (h.env == kEnvFailed) {
        queue_.pop_front();
        wake->push_back(head);
        continue;
      }
      if (h.env != kEnvReady) {  // stage 1 is under way (the env thread), or waits for room made here
        if (h.env == kEnvNone && InUse() + head->env_bytes() > options_.budget) return RoomForEnvironment(head);
        return {};
      }
      for (int g = 0; g < head->num_groups(); ++g) {  // the first one its running request still needs
        if (head->group_state(g) == kAbsent && !(h.running && h.finished[g])) return TryPrepare(head, g, false);
      }
      if (queue_.size() < 2) return {};
      // the current task is prepared: the next task's first sub-task, under the preset-count rule
      ModelObj* next = queue_[1];
      if (entries_.at(next).env != kEnvReady || next->group_state(0) != kAbsent) return {};
      int remaining = 0;
      for (int g = 0; g < head->num_groups(); ++g) {
        if (h.finished[g]) continue;
        ++remaining;
        if (head->group_bytes(g) + next->group_bytes(0) > options_.threshold2) return {};  // marked, not finished
      }
      if (remaining >= options_.preset_count) return {};
      return TryPrepare(next, 0, true);
    }
    return {};
  }

  void MemoryLoop() {
    device_->SetThreadUnits(0);
    StreamHandle copy = nullptr;
    if (device_->launches_async()) copy = device_->CreateStream(0, nullptr);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      std::vector<ModelObj*> wake;
      Action action = Decide(&wake);
      if (action.kind == kRoom) {  // its runtime's memory outside the switcher: asked outside the lock
        std::function<bool(size_t)> room = options_.room;
        lock.unlock();
        bool coming = false;
        try {
          coming = room(action.need);
        } catch (const std::exception&) {  // a failing callback is a refusal
        }
        lock.lock();
        if (!coming) {
          room_refused_.insert(action.m);  // decided again: the switch-in fails
        } else {
          cond_.wait_for(lock, std::chrono::milliseconds(2));
        }
        continue;
      }
      if (action.kind == kNone) {
        if (!blocked_.empty()) {  // tell the policy outside the lock (it may call into streams)
          std::vector<Blocked> blocked;
          blocked.swap(blocked_);
          ffi::Function callback = blocked_callback_;
          lock.unlock();
          for (Blocked& b : blocked) {
            try {
              callback(b.waiting, b.holders);
            } catch (const std::exception&) {  // a failing policy callback must not stop the switcher
            }
          }
          lock.lock();
          continue;
        }
        if (!wake.empty()) {
          lock.unlock();
          for (ModelObj* m : wake) m->Wake();
          lock.lock();
          continue;
        }
        cond_.wait_for(lock, std::chrono::milliseconds(50));
        continue;
      }
      ModelObj* m = action.m;
      Entry& e = entries_.at(m);
      std::vector<bool> pending = Pending(e);
      lock.unlock();
      for (ModelObj* w : wake) w->Wake();
      double start = Device::NowMicros();
      std::string error = action.error;
      bool prepared = false;
      std::vector<StageEvent> cleaned;
      if (action.kind == kPrepare) {
        try {
          m->PrepareGroup(action.groups[0], copy);
          prepared = true;
        } catch (const std::exception& err) {
          error = ErrorLine(err);
        }
      } else if (action.kind == kClean || action.kind == kEvict) {
        for (int g : action.groups) {  // (an eviction asked for may have none)
          double t = Device::NowMicros();
          m->CleanGroup(g, pending);
          cleaned.push_back({m->name(), action.kind == kEvict ? "evict" : "clean", g, t, Device::NowMicros(),
                             static_cast<int64_t>(m->group_bytes(g))});
        }
      }
      lock.lock();
      if (action.kind == kPrepare) {
        int g = action.groups[0];
        if (prepared) {
          Push({m->name(), "stage2", g, start, Device::NowMicros(), static_cast<int64_t>(m->group_bytes(g)),
                static_cast<int64_t>(ActiveBytes())});
          bool head = !queue_.empty() && queue_.front() == m;
          m->SetGroupState(g, head || m->group_bytes(g) + RunningBytes() <= options_.threshold2 ? kReady : kHeld);
        } else {
          m->SetGroupState(g, kAbsent);
          // the memory it found was taken meanwhile (a prefetch or a stage 1 beside it): decide again
          if (InUse() + m->GroupNeed(g) > options_.budget) error.clear();
        }
      } else if (action.kind == kClean || action.kind == kEvict) {
        for (StageEvent& c : cleaned) Push(std::move(c));
        bool drop_env = action.drop_env || AheadEnvBytes() > options_.threshold1;
        if (action.kind == kEvict && e.env == kEnvReady && drop_env && m->TryCleanEnvironment()) {
          e.env = kEnvNone;  // beyond threshold 1: its environment goes too
          Push({m->name(), "evict", -1, start, Device::NowMicros(), static_cast<int64_t>(m->env_bytes())});
        }
      }
      if (action.ticket) evicted_ = std::max(evicted_, action.ticket);
      if (!error.empty()) Fail(m, error);
      WakeUnlocked(lock, m);
    }
    lock.unlock();
    if (copy) device_->DestroyStream(copy);
  }

  /*! \brief Its requests fail with `error` (under mu_): its task leaves the queue. */
  void Fail(ModelObj* m, const std::string& error) {
    m->SetPlacementError(error);
    queue_.erase(std::remove(queue_.begin(), queue_.end(), m), queue_.end());
  }

  /*! \brief Wake `m`'s stream and the other stage thread, outside mu_ (the stream's waker takes its lock). */
  void WakeUnlocked(std::unique_lock<std::mutex>& lock, ModelObj* m) {
    lock.unlock();
    m->Wake();
    cond_.notify_all();
    lock.lock();
  }

  void EnvLoop() {
    device_->SetThreadUnits(0);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      ModelObj* m = nullptr;
      for (ModelObj* q : queue_) {  // in demand order: the current task first, then the next ones
        Entry& e = entries_.at(q);
        if (e.env != kEnvNone) continue;
        if (q != queue_.front() && AheadEnvBytes() + q->env_bytes() > options_.threshold1) break;  // paused
        if (InUse() + q->env_bytes() > options_.budget) break;  // no room yet: the memory thread makes some
        m = q;
        break;
      }
      if (!m) {
        cond_.wait_for(lock, std::chrono::milliseconds(50));
        continue;
      }
      entries_.at(m).env = kEnvPreparing;
      lock.unlock();
      double start = Device::NowMicros();
      std::string error;
      try {
        m->PrepareEnvironment();
      } catch (const std::exception& err) {
        error = ErrorLine(err);
      }
      lock.lock();
      Entry& e = entries_.at(m);
      if (error.empty()) {
        e.env = kEnvReady;
        Push({m->name(), "stage1", -1, start, Device::NowMicros(), static_cast<int64_t>(m->env_bytes()),
              static_cast<int64_t>(AheadEnvBytes())});
      } else if (InUse() + m->env_bytes() > options_.budget) {
        e.env = kEnvNone;  // the room it found was taken meanwhile (a stage 2 beside it): again when there is room
      } else {
        e.env = kEnvFailed;
        Fail(m, error);
      }
      WakeUnlocked(lock, m);
    }
  }

  std::shared_ptr<Device> device_;
  SwitchOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cond_;
  std::map<ModelObj*, Entry> entries_;
  std::deque<ModelObj*> queue_;  // switch tasks in demand order: the current one first
  struct EvictRequest {
    ModelObj* m;
    bool keep_env;
    uint64_t ticket;
  };
  std::deque<EvictRequest> evictions_;
  struct Blocked {
    Model waiting;
    ffi::Array<Model> holders;
  };
  ffi::Function blocked_callback_;  // SetBlockedCallback (null: none)
  std::vector<Blocked> blocked_;    // waits to report (NoteBlocked), delivered by the memory thread
  std::unordered_set<ModelObj*>
      reported_;  // waits reported since the last resume  // asked for by Evict (tvmsched bench switch)
  std::unordered_set<ModelObj*> room_refused_;  // switch-ins options_.room refused (until their request ends)
  uint64_t evict_tickets_ = 0, evicted_ = 0;
  std::vector<StageEvent> events_;
  uint64_t clock_ = 0;
  bool stop_ = false;
  std::thread env_thread_, memory_thread_;
};

SwitcherObj::SwitcherObj(std::shared_ptr<Device> device, SwitchOptions options)
    : core_(std::make_shared<SwitcherCore>(std::move(device), options)) {
  core_->Start();
}

SwitcherObj::~SwitcherObj() { Close(); }

void SwitcherObj::Add(Model model) { core_->Add(std::move(model), core_); }

bool SwitcherObj::Prefetch(Model model) { return core_->Prefetch(model.get()); }

std::vector<StageEvent> SwitcherObj::Events() const { return core_->Events(); }

void SwitcherObj::SetBlockedCallback(ffi::Function callback) { core_->SetBlockedCallback(std::move(callback)); }

const SwitchOptions& SwitcherObj::options() const { return core_->options(); }

bool SwitcherObj::Evict(Model model, bool keep_env) { return core_->Evict(model.get(), keep_env); }

bool SwitcherObj::Remove(Model model) { return core_->Remove(model.get()); }

void SwitcherObj::Close() { core_->Close(); }

Switcher Switcher::Create(std::shared_ptr<Device> device, SwitchOptions options) {
  return Switcher(ffi::make_object<SwitcherObj>(std::move(device), options));
}

double CopyFloorSeconds(ModelObj& model, int repeat) {
  auto weights = model.host_weights();
  if (!model.registered()) {
    TVM_FFI_THROW(TvmschedError) << "the copy floor needs a registered model (its weights in pinned host memory)";
  }
  Device& device = model.device();
  device.SetThreadUnits(0);
  std::vector<void*> buffers;
  double best = 0;
  try {
    for (const auto& [data, nbytes] : weights)
      buffers.push_back(device.Allocate(nbytes, "the copy floor of model " + model.name()));
    StreamHandle stream = device.launches_async() ? device.CreateStream(0, nullptr) : nullptr;
    for (int r = 0; r < std::max(1, repeat); ++r) {
      double start = Device::NowMicros();
      for (size_t i = 0; i < weights.size(); ++i)
        device.CopyToDevice(buffers[i], weights[i].first, weights[i].second, stream);
      if (stream) device.SyncStream(stream);
      double seconds = (Device::NowMicros() - start) / 1e6;
      best = r == 0 ? seconds : std::min(best, seconds);
    }
    if (stream) device.DestroyStream(stream);
  } catch (...) {
    for (void* b : buffers) device.Release(b);
    throw;
  }
  for (void* b : buffers) device.Release(b);
  return best;
}

}  // namespace tvmsched
