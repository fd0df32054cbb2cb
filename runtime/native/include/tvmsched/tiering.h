/*!
 * \file tvmsched/tiering.h
 * \brief Mechanism D of ../shared/mechanisms.md, the execution side: a model larger than the device
 *        memory it may use. docs/tiering.md states the plan this follows and what each part costs.
 *
 * A tiered model (LoadOptions::tiers) keeps on the device its environment, every activation, the
 * weights of its first layers that fit, and two stream buffers; its other weights ("streamed") live in
 * this device's shares of the host tiers, in priority order: DRAM and CXL (host memory bound to a NUMA
 * node with mbind, page-locked for the device) and disk (an unnamed file, gone when the model is).
 * Its layers are grouped so that each group's streamed weights fit one buffer; a streamer thread copies
 * the next group's weights into the free buffer while the current group runs (double buffering), in
 * the order the artifact's layers read them, never through demand paging. Every request runs the groups
 * in order from the first; after the last group the first one of the next request is already loaded.
 *
 * The choice of the tiers' sizes is the planner's (runtime/tiering.py, a policy): the engine only
 * fills the shares it is given and refuses a model they cannot hold.
 */
#ifndef TVMSCHED_TIERING_H_
#define TVMSCHED_TIERING_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tvmsched/device.h"
#include "tvmsched/model.h"

namespace tvmsched {

/*! \brief This device's share of one host tier. */
struct TierShare {
  std::string kind;     ///< "dram", "cxl" or "disk"
  size_t capacity = 0;  ///< bytes this device may place there
  int numa_node = -1;   ///< dram/cxl: bind to this node (-1: the default policy)
  std::string path;     ///< disk: the directory of the weight file
};

/*! \brief How a model larger than its device memory is placed (LoadOptions::tiers). */
struct TierOptions {
  size_t device_bytes = 0;  ///< device memory the model may hold, all of it included
  size_t buffer_bytes =
      0;  ///< each of the two stream buffers (0: the largest layer's weights or 1/8 of the room, the larger)
  std::vector<TierShare> tiers;  ///< in priority order
  /*! \brief Launches its stream keeps in flight on a device whose launches are asynchronous: the activations are
   *  planned for that many at load, inside device_bytes (a stream re-planning them later would pass it). */
  int in_flight = 8;
  /*! \brief Set: the model takes turns with other streamed models for its device memory (device_bytes). It holds
   *  that memory only while its turn lasts. When a request wants it, the streamer's thread asks
   *  `make_room(model, bytes, take)` — its runtime's choice: whether it is this model's turn, and whose turn ends
   *  (ParkStreamed, YieldStreamed) — which, if it is, calls `take` (the allocation: false when the room is not
   *  there) before any other turn is decided, and returns what `take` returned; false: it asks again when nudged
   *  (NudgeStreamed) or shortly. After YieldStreamed it gives its memory back as soon as its stream is idle. Its
   *  resident weights keep a host copy. Also asked once at load (false: it loads between turns). */
  std::function<bool(ModelObj*, size_t, const std::function<bool()>&)> make_room;
  /*! \brief Called (outside its locks) when its turn ended as YieldStreamed asked: the models waiting for memory
   *  are told at once (NudgeStreamed) instead of at their next look. */
  std::function<void()> turn_ended;
};

/*! \brief Where each streamed weight lives: the host tiers' memory and the disk file of one model. */
class TierStore {
 public:
  struct Home {
    int tier = -1;               ///< index into TierOptions::tiers
    const char* data = nullptr;  ///< dram/cxl: its bytes
    int64_t offset = -1;         ///< disk: its offset in the file (page-aligned)
    size_t nbytes = 0;
  };
  /*! \brief Place `weights` (id -> bytes, in the order given) in the tiers, filling each before the next;
   *  one TvmschedError line naming the shortfall when they cannot hold them. */
  TierStore(std::shared_ptr<Device> device, const std::vector<TierShare>& tiers,
            const std::vector<std::pair<std::string, const std::string*>>& weights, const std::string& model);
  ~TierStore();
  TierStore(const TierStore&) = delete;
  TierStore& operator=(const TierStore&) = delete;

  const Home& home(const std::string& id) const { return homes_.at(id); }
  /*! \brief Bytes placed in each tier (by index). */
  const std::vector<size_t>& used() const { return used_; }
  const std::vector<TierShare>& tiers() const { return tiers_; }
  /*! \brief Copy weight `id` into device memory `dst` on `stream` (0: synchronous); disk weights are read
   *  into `bounce` (page-aligned host memory of at least the page-rounded size) first, except on a CPU
   *  device, whose memory they are read into directly. Returns without waiting for the copy. */
  void Fetch(const std::string& id, void* dst, char* bounce, StreamHandle stream);
  bool direct_io() const { return direct_fd_ >= 0; }

 private:
  /*! \brief Give back the tiers' memory and close the file (the destructor, or a constructor that failed). */
  void Release();

  std::shared_ptr<Device> device_;
  std::vector<TierShare> tiers_;
  std::vector<size_t> used_;
  struct Region {
    char* base = nullptr;
    size_t bytes = 0;
  };
  std::vector<Region> regions_;  // per tier (disk: none)
  std::map<std::string, Home> homes_;
  int fd_ = -1, direct_fd_ = -1;  // the disk file; direct_fd_: the same file opened with O_DIRECT (or -1)
  bool host_memory_ = true;       // the device's memory is host memory (no bounce buffer)
};

/*! \brief Round up to the page size (4096): buffer layouts and the disk file use page-aligned places. */
inline size_t PageRound(size_t n) { return (n + 4095) / 4096 * 4096; }

/*! \brief Bind `nbytes` of fresh anonymous memory to NUMA node `node` (mbind, before it is touched);
 *  one TvmschedError line when the node does not exist or the kernel refuses. */
void BindToNode(void* addr, size_t nbytes, int node);

/*! \brief A tiered model's memory layout beside its groups: what streams, from where, into which buffers. Its
 *  streamer (the model's placement, made by InitStreamed in model.h) owns it; the model holds the groups, their
 *  activations and its resident weights, and binds the streamed weights where the streamer copied them. */
struct StreamedLayout {
  std::unique_ptr<TierStore> store;  ///< where each streamed weight lives (null once the tiers are released)
  std::set<std::string> streamed;    ///< the weights that live in the host tiers
  std::vector<int> groups;           ///< the groups with streamed weights, in layer order
  std::vector<size_t> stream_bytes;  ///< per group: the bytes it copies into a stream buffer (page-aligned)
  std::vector<std::vector<std::pair<std::string, size_t>>> offsets;  ///< per group: streamed weight -> its offset
  size_t buffer_bytes = 0;           ///< each stream buffer's use: the largest group's stream bytes
  size_t resident_weight_bytes = 0;  ///< the weights that stay on the device
  void* buffers[2] = {nullptr, nullptr};
  int num_buffers = 2;  ///< 2 (double buffering), or 1 where the device memory holds only one
};

/*! \brief The layout of a tiered model's streamer; null for a model that is not tiered or whose tiers were
 *  released. */
const StreamedLayout* StreamedLayoutOf(ModelObj& model);

/*! \brief Stop streaming and give the tiers back (their memory, the disk file) and the model's device memory: its
 *  later requests fail with one line. No request may be running; nothing for a model that is not tiered. */
void ReleaseTiers(ModelObj& model);

/*! \brief A turn-taking streamed model's turn (TierOptions::make_room). */
struct StreamedTurn {
  bool takes_turns = false;     ///< it was loaded with make_room
  bool in_memory = false;       ///< its device memory is held or being taken (false: parked between turns)
  bool wanting = false;         ///< a request of its waits for its memory
  size_t bytes = 0;             ///< the device memory its turn takes (its device_bytes)
  double last_used_us = 0;      ///< when its latest request ended (or its memory was taken)
  double wanting_since_us = 0;  ///< when a request began to wait for its memory (0: none waits; also while taking it)
  bool yielding = false;        ///< asked to end its turn (YieldStreamed): it takes no new request until it has
};
StreamedTurn TurnOf(ModelObj& model);

/*! \brief End a turn-taking model's turn now if nobody uses it: its device memory is given back (a "park" event);
 *  true if it holds none afterwards. Its next request takes it again ("unpark"). */
bool ParkStreamed(ModelObj& model);

/*! \brief Another model waits for memory: this one ends its turn when its stream is next idle. */
void YieldStreamed(ModelObj& model);

/*! \brief A turn ended: a model waiting for its memory looks again now. */
void NudgeStreamed(ModelObj& model);

/*! \brief The streamer's record: a "stream" event per group copied (bytes: what it copied); "park" and "unpark"
 *  events when a turn-taking model gave back or took its device memory (bytes: its turn's). */
std::vector<StageEvent> StreamerEvents(ModelObj& model);

/*! \brief Per tier (by kind), the seconds to copy the model's weights that live there into a stream
 *  buffer, the path its groups use (the fastest of `repeat`), and the bytes: the copy floor of a
 *  request. The model must be idle; the buffers are loaded again afterwards. */
std::map<std::string, std::pair<double, size_t>> TierCopyFloor(ModelObj& model, int repeat);

}  // namespace tvmsched

#endif  // TVMSCHED_TIERING_H_
