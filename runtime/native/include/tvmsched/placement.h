/*!
 * \file tvmsched/placement.h
 * \brief Where a model's memory is, as its stream sees it: one interface, three mechanisms.
 *
 *  - Resident (model.cc): everything is prepared at load and stays.
 *  - Staged (switching.cc, the switcher of registered models): the environment and each sub-task are prepared
 *    when a request needs them and cleaned when memory is wanted (mechanism C, docs/switching.md).
 *  - Streamed (tiering.cc): the weights of a model larger than its device memory are streamed from host tiers
 *    into buffers, sub-task by sub-task (mechanism D, docs/tiering.md).
 *
 * The stream asks Acquire before it launches a sub-task's first layer for a request (and for the environment,
 * group -1, before a request starts), tells Release after the sub-task's last layer and EndRequest when the
 * request ended. A placement only records and notifies from these calls (they come on stream threads, under
 * their locks); its own threads prepare and clean, and wake the stream (ModelObj::Wake).
 *
 * This header sits below model.h: placements include model.h, never the other way round.
 */
#ifndef TVMSCHED_PLACEMENT_H_
#define TVMSCHED_PLACEMENT_H_

#include <cstdint>
#include <string>

namespace tvmsched {

class ModelObj;

/*! \brief A sub-task's state (ModelObj::group_state). A stream launches a group's layers from kReady
 *  on: it leases the group (kReady/kFinished -> kLeased) for a request and finishes it after its last
 *  layer; a placement takes back only what it takes by compare-and-swap (kReady/kFinished -> kAbsent). */
enum GroupState : int { kAbsent = 0, kPreparing = 1, kHeld = 2, kReady = 3, kLeased = 4, kFinished = 5 };

/*! \brief One recorded stage of a placement: "stage1", "stage2", "exec", "clean", "evict" (switching) or "stream"
 *  (tiering); group -1: the environment. */
struct StageEvent {
  std::string model, stage;
  int group = -1;
  double start_us = 0, end_us = 0;
  int64_t bytes = 0;
  /*! \brief After the stage: stage2: bytes of the switching models' prepared and running sub-tasks
   *  (threshold 2's measure); stage1: bytes of the environments prepared ahead (threshold 1's); stream: the buffer. */
  int64_t held = 0;
};

class Placement {
 public:
  virtual ~Placement() = default;
  /*! \brief "resident", "staged" or "streamed" (for reports). */
  virtual const char* kind() const = 0;
  /*! \brief Whether it prepares memory when requests need it (a switcher, a streamer): a model has one at most. */
  virtual bool on_demand() const { return true; }

  /*! \brief The memory of sub-task `group` (-1: the environment) for the running request: leased to it (true), or
   *  asked for (false: the stream waits to be woken). */
  bool Acquire(ModelObj* model, int group);
  /*! \brief The running request executed sub-task `group`'s last layer at `end_us` (stamped before the sub-task
   *  becomes kFinished: a placement may take it back at once). */
  void Release(ModelObj* model, int group, double end_us);
  /*! \brief A request of the model ended (done or failed): its leases end. */
  void EndRequest(ModelObj* model);

  /*! \brief A request needs sub-task `group` (-1: the environment, or a request was queued). */
  virtual void Demand(ModelObj* /*model*/, int /*group*/) {}
  /*! \brief The model's stream was paused (preempted): it stops waiting for memory (so it holds up no other model)
   *  until its stream demands again. */
  virtual void Yield(ModelObj* /*model*/) {}
  /*! \brief The model's stream runs again (resumed, or finishing its started request). */
  virtual void Resumed(ModelObj* /*model*/) {}
  /*! \brief The model is going away: stop using it (a placement it owns joins its threads here). */
  virtual void Detach() {}

 protected:
  virtual void GroupStarted(ModelObj* /*model*/, int /*group*/) {}
  virtual void GroupFinished(ModelObj* /*model*/, int /*group*/, double /*end_us*/) {}
  virtual void RequestFinished(ModelObj* /*model*/) {}
};

}  // namespace tvmsched

#endif  // TVMSCHED_PLACEMENT_H_
