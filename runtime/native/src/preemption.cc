// The preemption group (tvmsched/preemption.h): members stopped while held requests run, without Python.
#include "tvmsched/preemption.h"

#include <tvm/ffi/cast.h>

#include <algorithm>

namespace tvmsched {

void PreemptionGroupObj::Add(Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::any_of(members_.begin(), members_.end(), [&](const Stream& s) { return s.same_as(stream); })) return;
  members_.push_back(stream);
  if (active() > 0) Stop(stream);
}

void PreemptionGroupObj::Remove(Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(members_.begin(), members_.end(), [&](const Stream& s) { return s.same_as(stream); });
  if (it == members_.end()) return;
  members_.erase(it);
  if (active() > 0) stream->Resume();  // paused by the group (or by nobody: Resume is harmless then)
}

std::vector<Stream> PreemptionGroupObj::Hold(Request request, Stream own) {
  return Hold(std::move(request), std::vector<Stream>{std::move(own)});
}

std::vector<Stream> PreemptionGroupObj::Hold(Request request, const std::vector<Stream>& own) {
  std::vector<Stream> stopped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (active_.fetch_add(1, std::memory_order_acq_rel) == 0) {
      for (const Stream& member : members_) {
        // a best-effort model's own real-time request
        if (std::any_of(own.begin(), own.end(), [&](const Stream& s) { return member.same_as(s); })) continue;
        if (Stop(member)) stopped.push_back(member);
      }
    }
  }
  // released as the request finishes, before its result can be seen (at once if it already has), on its stream's
  // submitter thread: whoever sees the last real-time result finds the best-effort streams resumed (or resuming as
  // soon as their own thread has drained, on a GPU)
  ffi::ObjectPtr<PreemptionGroupObj> self = ffi::GetObjectPtr<PreemptionGroupObj>(this);
  request->OnFinishing([self] { self->Release(); });
  return stopped;
}

int PreemptionGroupObj::FinishStartedOf(const ffi::Array<Model>& holders) {
  std::vector<Stream> holding;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (active() == 0) return 0;
    for (const Stream& member : members_) {
      for (const Model& holder : holders) {
        if (holder.same_as(member->model())) holding.push_back(member);
      }
    }
  }
  int finishing = 0;  // outside the lock: FinishStarted may wait for a drain, and a release must not wait for it
  for (const Stream& member : holding) finishing += member->FinishStarted() ? 1 : 0;
  return finishing;
}

bool PreemptionGroupObj::Stop(const Stream& member) {
  // idle ones too: a request it gets while the group is held waits (else it would run beside the real-time work)
  bool busy = member->busy();
  member->Preempt(true, false);  // its own thread drains what it has in flight
  if (busy) preempted.fetch_add(1);
  return busy;
}

void PreemptionGroupObj::Release() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (active_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // not waiting: a member still draining what it had in flight resumes once its own thread has drained it, so the
  // real-time stream's thread (here) never waits for best-effort kernels
  for (const Stream& member : members_) member->Resume(false);
}

}  // namespace tvmsched
