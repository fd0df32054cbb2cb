/*!
 * \file tvmsched/switching.h
 * \brief Mechanism C of ../shared/mechanisms.md (PipeSwitch-style fast switching): more registered
 *        models than device memory holds, each made resident when a request needs it, its preparation
 *        pipelined with its execution. docs/switching.md states the stages, rules and settings.
 *
 * A registered model (LoadOptions::resident = false) keeps its weights in pinned host memory. Its
 * task stages: stage 1 (ModelObj::PrepareEnvironment: kernel library, kernels, streams, the input and
 * output buffers), stage 2 per sub-task (ModelObj::PrepareGroup: the group's device memory and the
 * copy of its weights), execution (the model's Stream launches a group's layers once it is kReady) and
 * cleaning (ModelObj::CleanGroup). The switcher runs stage 1 on one thread and stage 2 and cleaning
 * on another, under the pipeline rules:
 *  - the next task's stage 1 runs while the current task prepares, while the environments prepared
 *    ahead hold at most threshold 1 bytes;
 *  - stage 2 of sub-task i+1 overlaps the execution of sub-task i; the running and prepared sub-tasks
 *    of switching models hold at most threshold 2 bytes;
 *  - the next task's first stage 2 starts once fewer than `preset_count` of the current task's
 *    sub-tasks are unexecuted and those marked (their bytes plus that sub-task's exceed threshold 2)
 *    have finished; it then runs at once if the current task has finished, else only while its bytes
 *    plus the running sub-tasks' stay within threshold 2;
 *  - finished sub-tasks are cleaned as soon as memory is wanted (retain = true: a switched-in model
 *    otherwise stays resident, and the least recently used idle models are evicted first), or as soon
 *    as they finish (retain = false: memory holds only what runs or is about to).
 * Device memory never passes the budget: Device::Allocate checks every allocation.
 */
#ifndef TVMSCHED_SWITCHING_H_
#define TVMSCHED_SWITCHING_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tvmsched/model.h"

namespace tvmsched {

struct SwitchOptions {
  size_t budget = 0;  ///< bytes (0: the scope's budget, else the device's, else what is in use plus its free memory)
  size_t threshold1 = 0;  ///< environments prepared ahead (0: budget / 4)
  size_t threshold2 = 0;  ///< running + prepared sub-tasks of switching models (0: the budget)
  int preset_count = 2;   ///< the next task's first stage 2 waits until fewer of the current's sub-tasks remain
  bool retain = true;     ///< keep a switched-in model resident until evicted (false: clean each finished sub-task)
  /*! \brief The budget of the models it switches (their Runtime's): `budget` 0 means this one's, and only
   *  their memory counts as in use. Null: the device's accounting (budget, else its free memory). */
  std::shared_ptr<MemoryScope> scope;
  /*! \brief Memory its runtime can have given back (turn-taking streamed models, tvmsched/tiering.h): asked with the
   *  bytes wanted, on the memory thread outside the switcher's lock, before a switch-in fails for memory that nothing
   *  of its own will free. true: given back or coming (it waits and decides again); false: the switch-in fails. */
  std::function<bool(size_t)> room;
};

class SwitcherCore;

class SwitcherObj : public ffi::Object {
 public:
  SwitcherObj(std::shared_ptr<Device> device, SwitchOptions options);
  ~SwitcherObj();
  /*! \brief Take a registered model (loaded with resident = false on this device). */
  void Add(Model model);
  /*! \brief Prepare it now on this thread if it fits beside what is resident without evicting anything;
   *  false: it stays registered. Stage 1 failures raise here. */
  bool Prefetch(Model model);
  /*! \brief Evict an idle registered model now (its environment too unless `keep_env`); false when
   *  it is in use or switching. For measuring switches (tvmsched bench switch). */
  bool Evict(Model model, bool keep_env);
  /*! \brief Let go of a model nobody uses (its stream closed): its prepared sub-tasks and environment are freed
   *  and it leaves the switcher; false when it is still in use. */
  bool Remove(Model model);
  std::vector<StageEvent> Events() const;
  /*! \brief `callback(waiting, holders)` when a model's switch-in waits for memory that only paused streams'
   *  started requests hold (once per wait, on the switcher's memory thread). */
  void SetBlockedCallback(ffi::Function callback);
  const SwitchOptions& options() const;
  /*! \brief Stop the threads and let go of the models (requests still waiting for a switch fail). */
  void Close();

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tvmsched.Switcher", SwitcherObj, ffi::Object);

 private:
  std::shared_ptr<SwitcherCore> core_;
};

class Switcher : public ffi::ObjectRef {
 public:
  static Switcher Create(std::shared_ptr<Device> device, SwitchOptions options);
  TVM_FFI_DEFINE_OBJECT_REF_METHODS_NULLABLE(Switcher, ffi::ObjectRef, SwitcherObj);
};

/*! \brief Seconds to copy a registered model's weights from its pinned host memory into device memory
 *  allocated beforehand (the copy floor of a switch): the fastest of `repeat` copies. */
double CopyFloorSeconds(ModelObj& model, int repeat);

}  // namespace tvmsched

#endif  // TVMSCHED_SWITCHING_H_
