/*!
 * \file tvmsched/sm_windows.h
 * \brief Which SMs a restricted-unit GPU stream runs on (the CUDA device's green contexts; docs/engine.md).
 *
 * The device's SMs are split once into groups of its green-context granularity (8 SMs on Hopper). A stream of k SMs
 * runs on a window of ceil(k / granularity) consecutive groups. A new window goes where the live windows cover the
 * fewest groups (the lowest such start on a tie), so tenants whose streams ask for k SMs each get disjoint SMs while
 * they fit. Splitting "k SMs" off the whole device for every context instead gives every context the same first k
 * SMs: a "partition" of three tenants at 44 SMs each then puts all three on SMs 0-47 and leaves the rest idle.
 * A pure class (no CUDA): the placement is tested on any machine (tvmsched.engine.place_sm_windows).
 */
#ifndef TVMSCHED_SM_WINDOWS_H_
#define TVMSCHED_SM_WINDOWS_H_

#include <algorithm>
#include <limits>
#include <vector>

namespace tvmsched {

class SmWindows {
 public:
  /*! \param prefix every window starts at group 0 (the placement before windows were spread; for comparisons). */
  explicit SmWindows(int groups = 0, bool prefix = false) : cover_(std::max(groups, 0), 0), prefix_(prefix) {}

  int groups() const { return static_cast<int>(cover_.size()); }
  /*! \brief How many live windows cover group `g`. */
  int coverage(int g) const { return cover_.at(g); }

  /*! \brief Take a window of `need` groups (clamped to 1..groups()); returns its first group and counts it live. */
  int Take(int need) {
    need = std::clamp(need, 1, groups());
    int best = 0;
    long best_cover = std::numeric_limits<long>::max();
    for (int first = 0; !prefix_ && first + need <= groups(); ++first) {
      long covered = 0;
      for (int g = first; g < first + need; ++g) covered += cover_[g];
      if (covered < best_cover) best = first, best_cover = covered;
    }
    for (int g = best; g < best + need; ++g) ++cover_[g];
    return best;
  }

  /*! \brief A window taken by Take(need) that returned `first` is no longer live. */
  void Give(int first, int need) {
    need = std::clamp(need, 1, groups());
    for (int g = first; g < first + need && g < groups(); ++g) cover_[g] = std::max(cover_[g] - 1, 0);
  }

 private:
  std::vector<int> cover_;
  bool prefix_ = false;
};

}  // namespace tvmsched

#endif  // TVMSCHED_SM_WINDOWS_H_
