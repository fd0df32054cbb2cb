// Percentiles of recorded times, as numpy computes them by default: the runtime's stats and decisions' (internal).
#ifndef TVMSCHED_SRC_PERCENTILE_H_
#define TVMSCHED_SRC_PERCENTILE_H_

#include <algorithm>
#include <cmath>
#include <deque>
#include <utility>
#include <vector>

namespace tvmsched {

/*! \brief The q-th percentile (linear between the closest ranks; -1: no values). */
inline double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return -1;
  std::sort(values.begin(), values.end());
  double pos = q / 100.0 * static_cast<double>(values.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos)), hi = static_cast<size_t>(std::ceil(pos));
  return values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
}

/*! \brief The p50 and p99 of recorded times (-1: none). */
inline std::pair<double, double> Percentiles(const std::deque<double>& recorded) {
  std::vector<double> times(recorded.begin(), recorded.end());
  return {Percentile(times, 50), Percentile(std::move(times), 99)};
}

}  // namespace tvmsched

#endif  // TVMSCHED_SRC_PERCENTILE_H_
