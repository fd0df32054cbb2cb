/*!
 * \file tvmsched/preemption.h
 * \brief A preemption group: the streams to stop while some requests run, stopped and restarted by the engine.
 *
 * The priority policy decides which requests hold the group (real-time ones) and which streams belong to it
 * (best-effort ones); the group acts without the policy on the request path:
 * - Hold(request, own): the first held request preempts every member but `own` (abort, not waiting: each
 *   member's own thread drains what it has in flight, StreamObj::Preempt(true, false)); idle members are paused
 *   too, so that a request they get while the group is held waits instead of running beside the held ones.
 * - when the last held request finishes (on its stream's submitter thread, no Python, before its result can be
 *   seen), every member resumes (on a GPU a member still draining what it had in flight resumes once it has:
 *   nobody waits).
 * A member added while the group is held is preempted at once.
 */
#ifndef TVMSCHED_PREEMPTION_H_
#define TVMSCHED_PREEMPTION_H_

#include <atomic>
#include <mutex>
#include <vector>

#include "tvmsched/stream.h"

namespace tvmsched {

class PreemptionGroupObj : public ffi::Object {
 public:
  /*! \brief A stream to stop while the group is held (preempted now if it is held). */
  void Add(Stream stream);
  /*! \brief It is stopped no more (it resumes if the group paused it). */
  void Remove(Stream stream);
  /*! \brief Hold the group while `request` (queued on `own`) runs; returns the busy members this call preempted. */
  std::vector<Stream> Hold(Request request, Stream own);
  /*! \brief Hold for a request that any of `own` may run (a model's streams): none of them is preempted. */
  std::vector<Stream> Hold(Request request, const std::vector<Stream>& own);
  /*! \brief A switch-in waits for memory that the started requests of the paused models `holders` keep: while the
   *  group is held, the members serving one of them finish their started request and pause again
   *  (StreamObj::FinishStarted). Returns how many did; 0 when not held (paused by someone else). */
  int FinishStartedOf(const ffi::Array<Model>& holders);
  /*! \brief Requests holding it now. */
  int64_t active() const { return active_.load(std::memory_order_acquire); }

  std::atomic<int64_t> preempted{0};  ///< busy member streams it preempted, in all

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tvmsched.PreemptionGroup", PreemptionGroupObj, ffi::Object);

 private:
  bool Stop(const Stream& member);  // preempt it; whether it was busy
  void Release();

  std::mutex mutex_;  // guards members_ and the transitions of active_ (a hold and a release never cross)
  std::atomic<int64_t> active_{0};
  std::vector<Stream> members_;
};

class PreemptionGroup : public ffi::ObjectRef {
 public:
  static PreemptionGroup Create() { return PreemptionGroup(ffi::make_object<PreemptionGroupObj>()); }
  TVM_FFI_DEFINE_OBJECT_REF_METHODS_NULLABLE(PreemptionGroup, ffi::ObjectRef, PreemptionGroupObj);
};

}  // namespace tvmsched

#endif  // TVMSCHED_PREEMPTION_H_
