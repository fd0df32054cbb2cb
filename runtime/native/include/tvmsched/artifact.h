/*!
 * \file tvmsched/artifact.h
 * \brief Reading a `.tvms` artifact without Python: a zip of stored members (manifest.json,
 *        kernels.so, weights.npz, checksums.json), checked member by member before use.
 */
#ifndef TVMSCHED_ARTIFACT_H_
#define TVMSCHED_ARTIFACT_H_

#include <dlpack/dlpack.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace tvmsched {

/*! \brief The artifact schema this engine reads (tvmsched.artifact.format.SCHEMA_VERSION). */
constexpr int kSchemaVersion = 1;

struct TensorSpec {
  std::vector<int64_t> shape;
  DLDataType dtype;
  std::string dtype_name;
  std::string kind;  ///< "input" | "weight" | "activation"
  size_t nbytes() const;
};

struct CandidateSpec {
  int id = 0;
  std::string kernel;     ///< symbol in kernels.so
  int units = 0;          ///< compute units it was built for (0: all)
  std::string mechanism;  ///< "cpu_threads", "green_context", "grid_limit" or ""
  bool idempotent = false;
  bool loop_checks = false;  ///< it checks the preempt flag inside its blocks' loops too (preempt_check "loops")
  int64_t blocks = 1;        ///< blocks of its launch (progress bitmap units)
  int64_t threads = 1;       ///< counter increments per block when it counts progress
  double latency_us = 1.0;
};

struct LayerSpec {
  int index = 0;
  std::string func;
  std::vector<std::string> inputs, outputs;
  std::vector<CandidateSpec> candidates;
};

struct Binding {
  std::string name, tensor;
};

/*! \brief A node whose run-time indices are bounds-checked: its flag, bit `bit` of the int32 scalar
 *  `tensor` (written by a layer), is set after a run that saw an out-of-range index. */
struct IndexCheckSpec {
  std::string tensor;
  int bit = 0;
  std::string message;  ///< the node and its valid range, for the request's error
};

struct Manifest {
  int schema_version = 0;
  std::string model_name, device, device_code;
  std::vector<Binding> inputs, outputs;
  std::map<std::string, TensorSpec> tensors;
  std::vector<LayerSpec> layers;
  std::vector<IndexCheckSpec> index_checks;
  int preempt_flags = 0;           ///< length of the flag array every kernel takes last (0: none)
  bool progress_counters = false;  ///< kernels take a per-layer counter after the flags
  std::optional<double> qos_ms;
  /*! \brief Rows every input's and output's first dimension holds when compiled for a batch (0: not compiled for
   *  one): a request may then bring 1 to batch_size rows, and the engine Runtime packs requests into one launch. */
  int64_t batch_size = 0;
  /*! \brief Compiled at several batch sizes: the smaller ones, smallest first, each a manifest of its own program
   *  (bindings, tensors, layers, index checks; the rest as here) over the same kernels.so and weights.npz. This
   *  manifest's program is the largest size. Empty for a variant. */
  std::vector<Manifest> variants;
  /*! \brief This program's run at candidate 0 measured at compile time (µs; 0: not measured). */
  double batch_latency_us = 0;
  std::string cpu;                        ///< the CPU the kernels were compiled for (LLVM's name; "": not recorded)
  std::vector<std::string> cpu_features;  ///< CPU features the kernels need (LLVM's names; x86-64 only)
};

/*! \brief The batch sizes `manifest` was compiled at, smallest first (empty: not compiled for a batch). */
std::vector<int64_t> BatchSizes(const Manifest& manifest);

/*! \brief A host array read from weights.npz (C order). */
struct HostArray {
  std::vector<int64_t> shape;
  DLDataType dtype;
  std::string data;
};

/*! \brief An artifact read and verified: manifest parsed, checksums matched, weights read. */
struct ArtifactContents {
  Manifest manifest;
  std::string manifest_json;  ///< manifest.json as verified (for callers that keep their own view of it)
  std::string kernels;        ///< kernels.so bytes
  std::map<std::string, HostArray> weights;
  std::string signer;  ///< the key id that signed it, when read with trusted keys
};

/*!
 * \brief Ed25519 public keys that artifacts must be signed by (OpenSSL). An artifact is native code:
 *  loading it runs its kernels.so, so a server that loads artifacts it did not build should trust
 *  only signed ones (README, "Trust model"). Empty: signatures are not checked.
 */
class TrustedKeys {
 public:
  /*! \brief Keys from PEM files (`tvmsched keys generate` writes NAME.pub); each problem one line. */
  static TrustedKeys FromFiles(const std::vector<std::string>& paths);
  /*! \brief Add a PEM public key; `what` names it in errors. */
  void AddPem(const std::string& pem, const std::string& what);
  bool empty() const { return keys_.empty(); }
  /*! \brief Check `signature_json` (signature.json; empty: none) over `message` (checksums.json's
   *  bytes) by one of these keys: the signer's key id, or one TvmschedError line naming `what`. */
  std::string Verify(const std::string& what, const std::string& signature_json, const std::string& message) const;
  /*! \brief A key's id: the first 16 hex digits of the SHA-256 of its 32 raw bytes. */
  static std::string KeyId(const std::string& raw_public_key);

 private:
  std::map<std::string, std::string> keys_;  // key id -> raw public key
};

/*!
 * \brief Read and verify an artifact. Every problem (missing, truncated, compressed or oversized
 *  members, checksum mismatch, newer schema, bad manifest or weights) is one TvmschedError line.
 *  With `trusted` keys, an artifact they did not sign is refused before any other member is used.
 *  `for_loading`: the caller will load its kernels.so (run its code); then, where the environment sets
 *  TVMSCHED_REQUIRE_SIGNATURE (to anything but "" or "0"), an artifact read without trusted keys is refused
 *  (readers that run no code, like `tvmsched inspect`, pass false). Without `with_weights` its weights are neither
 *  verified nor parsed (`weights` stays empty): for a model that reads another's device weights, or is only measured.
 *  `only_layers` (first, last; first < 0: all): parse only the weights those layers of its program read (a split
 *  model's part; CutLayers takes the rest away anyway).
 */
ArtifactContents ReadArtifact(const std::string& path, const TrustedKeys& trusted = TrustedKeys(),
                              bool for_loading = true, bool with_weights = true,
                              std::pair<int, int> only_layers = {-1, -1});

/*! \brief Make `contents` the program compiled at `batch` rows (one of BatchSizes; its manifest becomes that size's and
 *  its weights the ones that size reads); one TvmschedError line naming `path` when it is not compiled at that size. */
void SelectBatch(ArtifactContents* contents, int64_t batch, const std::string& path);

/*! \brief Make `contents` layers `first` to `last` of its program as a model of their own: a split model's part
 *  (tvmsched/split.h). Its inputs are the model's inputs those layers read, then the activations they read that
 *  earlier layers write (each bound under its tensor id); its outputs are the model's outputs they write, then the
 *  activations they write that later layers read (under their ids); its weights only the ones they read. The kernels,
 *  flags and counters are the model's; `manifest_json` stays the whole model's. One TvmschedError line naming `path`
 *  for a range outside the program or a model that cannot be cut there. */
void CutLayers(ArtifactContents* contents, int first, int last, const std::string& path);

/*! \brief Whether the environment requires every artifact whose code is loaded to be signed by a trusted key
 *  (TVMSCHED_REQUIRE_SIGNATURE set to anything but "" or "0"). */
bool SignatureRequired();

/*! \brief A regular file open for reading (`what` names it in errors: "artifact", "trusted key"). A missing file, a
 *  directory, a FIFO, socket or device (which could block or never end) and a file larger than this machine's memory
 *  are one TvmschedError line each. */
class RegularFile {
 public:
  RegularFile(const std::string& path, const std::string& what);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  uint64_t size() const { return size_; }
  /*! \brief `n` bytes from `offset` (fewer where the file ends first, as when it shrank while read). */
  std::string Read(uint64_t offset, uint64_t n) const;

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_, what_;
};

/*! \brief The bytes of the regular file at `path` (`what` names it in errors: "artifact", "trusted key").
 *  A missing file, a directory, a FIFO, socket or device (which could block or never end) and a file
 *  larger than this machine's memory are one TvmschedError line each. */
std::string ReadRegularFile(const std::string& path, const std::string& what);

/*! \brief The members of a zip archive of stored members, by name; `what` names it in errors. More
 *  than `max_members` members, compressed members, or members past the end are one-line errors. */
std::map<std::string, std::string> ReadStoredZip(const std::string& bytes, const std::string& what,
                                                 size_t max_members = 65535);
/*! \brief The same, read piece by piece through `read(offset, n)` from an archive of `size` bytes (only its directory
 *  and the members are read); the members named in `skip` are checked but not read (their value is empty). */
using ZipRead = std::function<std::string(uint64_t offset, uint64_t n)>;
std::map<std::string, std::string> ReadStoredZip(uint64_t size, const ZipRead& read, const std::string& what,
                                                 size_t max_members, const std::set<std::string>& skip = {});

/*! \brief Deepest nesting the engine parses in an artifact's JSON members (tvm-ffi's parser recurses). */
constexpr int kMaxJsonDepth = 64;

/*! \brief Throw std::invalid_argument naming `what` if `text`'s brackets nest deeper than `max_depth`
 *  (a scan without recursion, run before any JSON parser sees `text`). */
void CheckJsonDepth(const std::string& text, const std::string& what, int max_depth);

/*! \brief Whether `text` is well-formed UTF-8 (JSON's encoding: no overlong forms, no surrogates). */
bool IsUtf8(std::string_view text);

/*! \brief Refuse, with one TvmschedError line naming `what` (the artifact), to load kernels that need CPU
 *  features this CPU lacks (manifest.cpu_features against CPUID and the OS's XSAVE state); x86-64 only. */
void CheckCpuFeatures(const Manifest& manifest, const std::string& what);
/*! \brief The same check for an artifact that is not a file yet (`cpu`, `features` as in the manifest). */
void CheckCpuFeatures(const std::string& cpu, const std::vector<std::string>& features, const std::string& what);

/*! \brief The CPU features the engine can check (LLVM's names, sorted), and those this CPU has. */
std::vector<std::string> CheckedCpuFeatures();
const std::set<std::string>& HostCpuFeatures();

/*! \brief The x86-64 levels ("x86-64-v2" .. "x86-64-v4") and the checked features each needs. */
std::map<std::string, std::vector<std::string>> CpuLevels();

/*! \brief Lowercase hex SHA-256 of `data` (OpenSSL). */
std::string Sha256Hex(const std::string& data);

/*! \brief A DLPack dtype from its name ("float32", "int64", "bool", ...), or a TvmschedError. */
DLDataType ParseDType(const std::string& name);

}  // namespace tvmsched

#endif  // TVMSCHED_ARTIFACT_H_
