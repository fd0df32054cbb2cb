// The CPU check before an artifact's kernels are loaded: the manifest names the CPU features its kernels
// need (LLVM's names, tvmsched.lower.targets.X86_RUNTIME_FEATURES); a CPU that lacks one would die on an
// illegal instruction in the middle of a run, so the load is refused with one line instead. The host's
// features come from CPUID and XGETBV (the OS must save the AVX / AVX-512 registers), the way LLVM's
// own host detection reads them (tvmsched.lower.targets.host_cpu_features must agree). x86-64 only: on other
// architectures nothing is checked (their artifacts record no features).
#include <tvm/ffi/error.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "tvmsched/artifact.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TVMSCHED_X86 1
#endif

namespace tvmsched {
namespace {

enum Reg { kEax, kEbx, kEcx, kEdx };
enum Save { kNone, kAvxState, kAvx512State };  // register state the OS must save for the feature to be usable

struct FeatureBit {
  const char* name;  // LLVM's feature name
  unsigned leaf, subleaf;
  Reg reg;
  int bit;
  Save save;
};

// Keep in step with X86_RUNTIME_FEATURES in tvmsched/lower/targets.py (tests/test_targets.py compares them).
constexpr FeatureBit kFeatures[] = {
    {"sse3", 1, 0, kEcx, 0, kNone},
    {"ssse3", 1, 0, kEcx, 9, kNone},
    {"fma", 1, 0, kEcx, 12, kAvxState},
    {"cx16", 1, 0, kEcx, 13, kNone},
    {"sse4.1", 1, 0, kEcx, 19, kNone},
    {"sse4.2", 1, 0, kEcx, 20, kNone},
    {"movbe", 1, 0, kEcx, 22, kNone},
    {"popcnt", 1, 0, kEcx, 23, kNone},
    {"avx", 1, 0, kEcx, 28, kAvxState},
    {"f16c", 1, 0, kEcx, 29, kAvxState},
    {"bmi", 7, 0, kEbx, 3, kNone},
    {"avx2", 7, 0, kEbx, 5, kAvxState},
    {"bmi2", 7, 0, kEbx, 8, kNone},
    {"avx512f", 7, 0, kEbx, 16, kAvx512State},
    {"avx512dq", 7, 0, kEbx, 17, kAvx512State},
    {"adx", 7, 0, kEbx, 19, kNone},
    {"avx512ifma", 7, 0, kEbx, 21, kAvx512State},
    {"avx512cd", 7, 0, kEbx, 28, kAvx512State},
    {"avx512bw", 7, 0, kEbx, 30, kAvx512State},
    {"avx512vl", 7, 0, kEbx, 31, kAvx512State},
    {"avx512vbmi", 7, 0, kEcx, 1, kAvx512State},
    {"avx512vbmi2", 7, 0, kEcx, 6, kAvx512State},
    {"gfni", 7, 0, kEcx, 8, kNone},
    {"avx512vnni", 7, 0, kEcx, 11, kAvx512State},
    {"avx512bitalg", 7, 0, kEcx, 12, kAvx512State},
    {"avx512vpopcntdq", 7, 0, kEcx, 14, kAvx512State},
    {"avx512vp2intersect", 7, 0, kEdx, 8, kAvx512State},
    {"avx512fp16", 7, 0, kEdx, 23, kAvx512State},
    {"avxvnni", 7, 1, kEax, 4, kAvxState},
    {"avx512bf16", 7, 1, kEax, 5, kAvx512State},
    {"avxifma", 7, 1, kEax, 23, kAvxState},
    {"avxvnniint8", 7, 1, kEdx, 4, kAvxState},
    {"avxneconvert", 7, 1, kEdx, 5, kAvxState},
    {"avxvnniint16", 7, 1, kEdx, 10, kAvxState},
    {"sahf", 0x80000001, 0, kEcx, 0, kNone},
    {"lzcnt", 0x80000001, 0, kEcx, 5, kNone},
    {"sse4a", 0x80000001, 0, kEcx, 6, kNone},
    {"xop", 0x80000001, 0, kEcx, 11, kAvxState},
    {"fma4", 0x80000001, 0, kEcx, 16, kAvxState},
};

// The x86-64 micro-architecture levels beyond the baseline, as LLVM defines them (restricted to the
// checked features), most capable first: what a refusal suggests compiling for instead.
const std::vector<std::pair<std::string, std::set<std::string>>>& Levels() {
  static const auto* levels = [] {
    std::set<std::string> v2 = {"cx16", "popcnt", "sahf", "sse3", "sse4.1", "sse4.2", "ssse3"};
    std::set<std::string> v3 = v2;
    v3.insert({"avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe"});
    std::set<std::string> v4 = v3;
    v4.insert({"avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl"});
    return new std::vector<std::pair<std::string, std::set<std::string>>>{
        {"x86-64-v4", v4}, {"x86-64-v3", v3}, {"x86-64-v2", v2}};
  }();
  return *levels;
}

#ifdef TVMSCHED_X86
std::set<std::string> DetectHostFeatures() {
  std::set<std::string> found;
  unsigned max_leaf = __get_cpuid_max(0, nullptr), max_ext = __get_cpuid_max(0x80000000, nullptr);
  unsigned a, b, c, d;
  bool avx_state = false, avx512_state = false;
  if (max_leaf >= 1 && __get_cpuid_count(1, 0, &a, &b, &c, &d) && ((c >> 27) & 1)) {  // OSXSAVE: XGETBV works
    uint32_t xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    avx_state = (xcr0_lo & 0x6) == 0x6;                    // XMM and YMM state
    avx512_state = avx_state && (xcr0_lo & 0xe0) == 0xe0;  // opmask, ZMM0-15 upper halves, ZMM16-31
  }
  unsigned max_sub7 = 0;
  if (max_leaf >= 7 && __get_cpuid_count(7, 0, &a, &b, &c, &d)) max_sub7 = a;
  for (const FeatureBit& f : kFeatures) {
    if (f.leaf >= 0x80000000 ? f.leaf > max_ext : f.leaf > max_leaf) continue;
    if (f.leaf == 7 && f.subleaf > max_sub7) continue;
    unsigned regs[4] = {0, 0, 0, 0};
    if (!__get_cpuid_count(f.leaf, f.subleaf, &regs[0], &regs[1], &regs[2], &regs[3])) continue;
    if (!((regs[f.reg] >> f.bit) & 1)) continue;
    if ((f.save == kAvxState && !avx_state) || (f.save == kAvx512State && !avx512_state)) continue;
    found.insert(f.name);
  }
  return found;
}
#endif

std::string HostCpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    std::string name = line.substr(colon + 1);
    name.erase(0, name.find_first_not_of(" \t"));
    if (!name.empty()) return name;
  }
  return "x86-64";
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

std::vector<std::string> CheckedCpuFeatures() {
  std::vector<std::string> out;
  for (const FeatureBit& f : kFeatures) out.push_back(f.name);
  std::sort(out.begin(), out.end());
  return out;
}

const std::set<std::string>& HostCpuFeatures() {
#ifdef TVMSCHED_X86
  static const std::set<std::string> features = DetectHostFeatures();
#else
  static const std::set<std::string> features;
#endif
  return features;
}

std::map<std::string, std::vector<std::string>> CpuLevels() {
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [name, features] : Levels()) out[name] = std::vector<std::string>(features.begin(), features.end());
  return out;
}

void CheckCpuFeatures(const Manifest& manifest, const std::string& what) {
  CheckCpuFeatures(manifest.cpu, manifest.cpu_features, what);
}

void CheckCpuFeatures(const std::string& cpu, const std::vector<std::string>& features, const std::string& what) {
#ifdef TVMSCHED_X86
  if (features.empty()) return;
  const std::set<std::string>& has = HostCpuFeatures();
  std::vector<std::string> missing;  // a name the engine does not know is one it cannot vouch for: missing too
  for (const std::string& f : features) {
    if (!has.count(f)) missing.push_back(f);
  }
  if (missing.empty()) return;
  std::string level = "portable";
  for (const auto& [name, features] : Levels()) {
    if (std::includes(has.begin(), has.end(), features.begin(), features.end())) {
      level = name;
      break;
    }
  }
  TVM_FFI_THROW(TvmschedError) << what << " was compiled for " << (cpu.empty() ? "another CPU" : cpu)
                               << " and needs CPU features " << Join(missing) << " that this CPU (" << HostCpuModel()
                               << ") lacks; recompile with --target llvm on this machine or --target llvm:" << level;
#else
  (void)cpu;  // other architectures: not checked (their artifacts record no x86 features)
  (void)features;
  (void)what;
#endif
}

}  // namespace tvmsched
