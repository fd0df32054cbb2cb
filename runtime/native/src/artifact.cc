// The artifact reader: zip of stored members -> checksums -> manifest (tvm-ffi's JSON parser) -> weights (.npy).
#include "tvmsched/artifact.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/string.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "tvmsched/npz.h"

namespace tvmsched {

namespace ffi = tvm::ffi;

size_t TensorSpec::nbytes() const {
  size_t n = (static_cast<size_t>(dtype.bits) * dtype.lanes + 7) / 8;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

DLDataType ParseDType(const std::string& name) {
  if (name == "bool") return DLDataType{kDLBool, 8, 1};
  struct Prefix {
    const char* text;
    uint8_t code;
  };
  for (Prefix p :
       {Prefix{"bfloat", kDLBfloat}, Prefix{"float", kDLFloat}, Prefix{"uint", kDLUInt}, Prefix{"int", kDLInt}}) {
    size_t len = std::char_traits<char>::length(p.text);
    if (name.compare(0, len, p.text) == 0 && name.size() > len) {
      int bits = std::atoi(name.c_str() + len);
      if (bits == 8 || bits == 16 || bits == 32 || bits == 64) return DLDataType{p.code, static_cast<uint8_t>(bits), 1};
    }
  }
  TVM_FFI_THROW(TvmschedError) << "unsupported dtype " << name;
}

namespace {

uint32_t Le32(const std::string& b, size_t at) {
  return uint32_t(uint8_t(b[at])) | uint32_t(uint8_t(b[at + 1])) << 8 | uint32_t(uint8_t(b[at + 2])) << 16 |
         uint32_t(uint8_t(b[at + 3])) << 24;
}
uint16_t Le16(const std::string& b, size_t at) { return uint16_t(uint8_t(b[at]) | uint8_t(b[at + 1]) << 8); }
uint64_t Le64(const std::string& b, size_t at) { return uint64_t(Le32(b, at)) | uint64_t(Le32(b, at + 4)) << 32; }

/*! \brief `text` with control characters escaped (\\n, \\x1b): manifest strings quoted in an error keep it one line. */
std::string Printable(const std::string& text) {
  std::string out;
  for (char c : text) {
    auto byte = static_cast<uint8_t>(c);
    if (c == '\n')
      out += "\\n";
    else if (byte < 0x20 || byte == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out;
}

[[noreturn]] void Corrupt(const std::string& what, const std::string& why) {
  TVM_FFI_THROW(TvmschedError) << what << " is not a readable tvmsched artifact (truncated or corrupt: " << why << ")";
}

// ---- manifest --------------------------------------------------------------------------------

/*! \brief Typed access to a JSON object, each missing or mistyped field a one-line error. */
class Json {
 public:
  Json(ffi::Any value, std::string where) : value_(std::move(value)), where_(std::move(where)) {}
  Json operator[](const char* key) const {
    auto object = value_.try_cast<ffi::Map<ffi::Any, ffi::Any>>();
    if (!object) Fail("is not an object");
    auto found = object->find(ffi::String(key));
    return Json(found == object->end() ? ffi::Any() : (*found).second, where_ + "." + key);
  }
  bool null() const { return value_ == nullptr; }
  std::string str() const {
    auto s = value_.try_cast<ffi::String>();
    if (!s) Fail("is not a string");
    return std::string(*s);
  }
  int64_t integer() const {
    auto v = value_.as<int64_t>();
    if (!v) Fail("is not an integer");
    return *v;
  }
  int64_t integer_or(int64_t fallback) const { return null() ? fallback : integer(); }
  /*! \brief An integer in [lo, hi] (null: `fallback`), else a one-line error naming the field. */
  int64_t integer_in(int64_t lo, int64_t hi, int64_t fallback) const {
    if (null()) return fallback;
    int64_t v = integer();
    if (v < lo || v > hi)
      Fail(("is " + std::to_string(v) + ", outside " + std::to_string(lo) + ".." + std::to_string(hi)).c_str());
    return v;
  }
  /*! \brief A finite number in [lo, hi] (null: `fallback`), else a one-line error naming the field. */
  double number_in(double lo, double hi, double fallback) const {
    if (null()) return fallback;
    double v = number();
    if (!std::isfinite(v) || v < lo || v > hi) {
      std::ostringstream text;
      text << "is " << v << ", outside " << lo << ".." << hi;
      Fail(text.str().c_str());
    }
    return v;
  }
  double number() const {
    if (auto i = value_.as<int64_t>()) return static_cast<double>(*i);
    auto v = value_.as<double>();
    if (!v) Fail("is not a number");
    return *v;
  }
  bool boolean() const {
    auto v = value_.as<bool>();
    if (!v) Fail("is not a boolean");
    return *v;
  }
  std::vector<Json> items() const {
    auto array = value_.try_cast<ffi::Array<ffi::Any>>();
    if (!array) Fail("is not a list");
    std::vector<Json> out;
    for (size_t i = 0; i < array->size(); ++i) out.emplace_back((*array)[i], where_ + "[" + std::to_string(i) + "]");
    return out;
  }
  std::vector<std::pair<std::string, Json>> entries() const {
    auto object = value_.try_cast<ffi::Map<ffi::Any, ffi::Any>>();
    if (!object) Fail("is not an object");
    std::vector<std::pair<std::string, Json>> out;
    for (const auto& kv : *object) {
      auto key = kv.first.try_cast<ffi::String>();
      if (!key) Fail("has a non-string key");
      out.emplace_back(std::string(*key), Json(kv.second, where_ + "." + std::string(*key)));
    }
    return out;
  }
  /*! \brief A string that names something (a tensor, kernel, CPU feature...): no control characters, so that
   *  an error quoting it stays one line. */
  std::string name() const {
    std::string s = str();
    for (char c : s) {
      if (static_cast<uint8_t>(c) < 0x20 || c == 0x7f) Fail("contains a control character");
    }
    return s;
  }
  std::vector<std::string> strings() const {
    std::vector<std::string> out;
    for (const Json& item : items()) out.push_back(item.name());
    return out;
  }

 private:
  [[noreturn]] void Fail(const char* why) const { throw std::invalid_argument(where_ + " " + why); }
  ffi::Any value_;
  std::string where_;
};

/*! \brief What the kernels rely on before any runs: every tensor has a known size, every model input
 *  tensor is bound to an input (else a kernel reads uninitialised memory), every layer reads only
 *  weights, inputs or earlier layers' outputs, activations are written by exactly one layer, and
 *  candidates are numbered by position. */
void CheckInvariants(const Manifest& m) {
  for (const auto& [id, spec] : m.tensors) {
    double bytes = (spec.dtype.bits + 7) / 8;
    for (int64_t d : spec.shape) bytes *= static_cast<double>(d);
    if (bytes > double(int64_t(1) << 40)) {
      std::ostringstream text;
      text << "tensor " << id << " needs " << std::fixed << std::setprecision(0) << bytes
           << " bytes, more than the engine's limit of 1 TiB per tensor";
      throw std::invalid_argument(text.str());
    }
    if (spec.kind != "input" && spec.kind != "weight" && spec.kind != "activation") {
      throw std::invalid_argument("tensor " + id + " has unknown kind " + spec.kind);
    }
  }
  if (m.batch_size > 0) {  // a batched model: every input and output holds the batch first
    for (const auto* bindings : {&m.inputs, &m.outputs}) {
      for (const Binding& b : *bindings) {
        const std::vector<int64_t>& shape = m.tensors.at(b.tensor).shape;
        if (shape.empty() || shape[0] != m.batch_size)
          throw std::invalid_argument(b.name + "'s first dimension is not the batch size " +
                                      std::to_string(m.batch_size));
      }
    }
  }
  std::set<std::string> bound, written;
  for (const Binding& b : m.inputs) {
    if (m.tensors.at(b.tensor).kind != "input")
      throw std::invalid_argument("input " + b.name + " is bound to a non-input tensor");
    if (!bound.insert(b.tensor).second) throw std::invalid_argument("tensor " + b.tensor + " is bound to two inputs");
  }
  for (const auto& [id, spec] : m.tensors) {
    if (spec.kind == "input" && !bound.count(id))
      throw std::invalid_argument("input tensor " + id + " is bound to no model input");
  }
  for (const LayerSpec& layer : m.layers) {
    for (const auto& id : layer.inputs) {
      const std::string& kind = m.tensors.at(id).kind;
      if (kind == "activation" && !written.count(id)) {
        throw std::invalid_argument("layer " + layer.func + " reads " + id + " before any layer writes it");
      }
    }
    for (const auto& id : layer.outputs) {
      if (m.tensors.at(id).kind != "activation")
        throw std::invalid_argument("layer " + layer.func + " writes non-activation " + id);
      if (!written.insert(id).second) throw std::invalid_argument("tensor " + id + " is written by two layers");
    }
    for (size_t c = 0; c < layer.candidates.size(); ++c) {
      if (layer.candidates[c].id != static_cast<int>(c))
        throw std::invalid_argument("layer " + layer.func + " has candidate ids out of order");
    }
  }
  for (const Binding& b : m.outputs) {
    if (m.tensors.at(b.tensor).kind == "activation" && !written.count(b.tensor)) {
      throw std::invalid_argument("output " + b.name + " is written by no layer");
    }
  }
  for (const IndexCheckSpec& c : m.index_checks) {
    const TensorSpec& spec = m.tensors.at(c.tensor);
    if (!written.count(c.tensor) || !spec.shape.empty() || spec.dtype_name != "int32") {
      throw std::invalid_argument("index check " + c.tensor + " is not an int32 scalar written by a layer");
    }
  }
}

}  // namespace

bool IsUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    auto byte = [&](size_t at) { return static_cast<uint8_t>(text[at]); };
    uint8_t c = byte(i);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > text.size()) return false;
    uint32_t code = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (size_t k = 1; k < len; ++k) {
      if ((byte(i + k) & 0xc0) != 0x80) return false;
      code = code << 6 | (byte(i + k) & 0x3f);
    }
    static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};  // overlong forms are not UTF-8
    if (code < kMin[len] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

void CheckJsonDepth(const std::string& text, const std::string& what, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {  // no recursion: the parser's own would overflow the stack
    char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        throw std::invalid_argument(what + " nests deeper than " + std::to_string(max_depth) + " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

namespace {

// Bounds of the manifest's numbers: far beyond any real machine or kernel, so that a value outside them
// is a corrupt or hostile manifest (refused with one line), never a number shown or used as if real.
constexpr int64_t kMaxUnits = 1 << 16;  // CPU threads or SMs a candidate runs on; GPU threads per block
constexpr int64_t kMaxBlocks = int64_t(1)
                               << 40;  // blocks of one launch (GPU grids top out near 2^63, real ones far lower)
constexpr int64_t kMaxBytes = int64_t(1) << 50;  // a layer's or candidate's bytes
constexpr double kMaxLatencyUs = 3.6e9;          // an hour, in microseconds

/*! \brief A program's fields of `json` (a manifest or one of its variants) into `m`, whose progress_counters is set. */
void ParseProgram(const Json& json, Manifest* out) {
  Manifest& m = *out;
  for (const char* side : {"inputs", "outputs"}) {
    for (const Json& b : json[side].items())
      (side[0] == 'i' ? m.inputs : m.outputs).push_back({b["name"].name(), b["tensor"].name()});
  }
  for (const auto& [id, t] : json["tensors"].entries()) {
    TensorSpec spec;
    for (const Json& d : t["shape"].items()) {
      int64_t dim = d.integer();
      if (dim < 0 || dim > (int64_t(1) << 40)) throw std::invalid_argument("tensor " + id + " has a bad shape");
      spec.shape.push_back(dim);
    }
    spec.dtype_name = t["dtype"].name();
    spec.dtype = ParseDType(spec.dtype_name);
    spec.kind = t["kind"].name();
    m.tensors.emplace(id, std::move(spec));
  }
  auto known = [&](const std::string& id) {
    if (!m.tensors.count(id)) throw std::invalid_argument("unknown tensor " + id);
    return id;
  };
  for (const Binding& b : m.inputs) known(b.tensor);
  for (const Binding& b : m.outputs) known(b.tensor);
  for (const Json& l : json["layers"].items()) {
    LayerSpec layer;
    if (l["index"].integer() != static_cast<int64_t>(m.layers.size()))
      throw std::invalid_argument("layers are out of order");
    layer.index = static_cast<int>(m.layers.size());
    layer.func = l["func"].name();
    for (const auto& id : l["inputs"].strings()) layer.inputs.push_back(known(id));
    for (const auto& id : l["outputs"].strings()) layer.outputs.push_back(known(id));
    for (const Json& c : l["candidates"].items()) {
      CandidateSpec cand;
      int64_t id = c["id"].integer();  // numbered by position (CheckInvariants), compared before any narrowing
      cand.id = id == static_cast<int64_t>(layer.candidates.size()) ? static_cast<int>(id) : -1;
      cand.kernel = c["kernel"].name();
      cand.units = static_cast<int>(c["units"].integer_in(0, kMaxUnits, 0));
      cand.mechanism = c["mechanism"].null() ? "" : c["mechanism"].name();
      cand.idempotent = !c["idempotent"].null() && c["idempotent"].boolean();
      cand.loop_checks = !c["preempt_check"].null() && c["preempt_check"].name() == "loops";
      cand.threads = c["threads"].integer_in(1, kMaxUnits, 1);
      // the progress bitmap's unit: blocks the kernels count when they count, else the launch's blocks
      int64_t blocks = c["blocks"].integer_in(0, kMaxBlocks, 1),
              progress_blocks = c["progress_blocks"].integer_in(0, kMaxBlocks, 1);
      cand.blocks = std::max<int64_t>(1, m.progress_counters ? progress_blocks : blocks);
      cand.latency_us = c["latency_us"].number_in(0, kMaxLatencyUs, 1.0);
      c["memory_bytes"].integer_in(0, kMaxBytes, 0);  // shown by inspect; range-checked like the rest
      layer.candidates.push_back(std::move(cand));
    }
    l["flops"].number_in(0, 1e21, 0);
    l["bytes"].integer_in(0, kMaxBytes, 0);
    l["qos_bound_us"].number_in(0, kMaxLatencyUs, 0);
    if (!l["unit_latency_us"].null()) {
      for (const auto& [units, latency] : l["unit_latency_us"].entries()) latency.number_in(0, kMaxLatencyUs, 0);
    }
    if (layer.candidates.empty()) throw std::invalid_argument("layer " + layer.func + " has no candidates");
    m.layers.push_back(std::move(layer));
  }
  if (!json["index_checks"].null()) {
    for (const Json& c : json["index_checks"].items()) {
      int64_t bit = c["bit"].integer();
      if (bit < 0 || bit > 30)
        throw std::invalid_argument("index check bit " + std::to_string(bit) + " is out of range");
      m.index_checks.push_back({known(c["tensor"].name()), static_cast<int>(bit), c["message"].str()});
    }
  }
}

Manifest ParseManifest(const std::string& text) {
  if (!IsUtf8(text)) throw std::invalid_argument("manifest.json is not UTF-8");
  CheckJsonDepth(text, "manifest.json", kMaxJsonDepth);
  ffi::String error;
  ffi::Any root = ffi::json::Parse(ffi::String(text), &error);
  if (!error.empty()) throw std::invalid_argument("manifest.json is not JSON: " + std::string(error));
  Json json(root, "manifest");
  Manifest m;
  // clamped, never wrapped into the version this engine reads; the caller reports any other version
  m.schema_version = static_cast<int>(std::clamp<int64_t>(json["schema_version"].integer(), -(1 << 30), 1 << 30));
  if (m.schema_version != kSchemaVersion) return m;  // the caller reports the version
  m.model_name = json["model_name"].name();
  m.device = json["device"].str();
  if (m.device != "cpu" && m.device != "cuda") throw std::invalid_argument("manifest.device must be cpu or cuda");
  m.device_code = json["device_code"].name();
  m.progress_counters = !json["progress_counters"].null() && json["progress_counters"].boolean();
  m.preempt_flags = static_cast<int>(json["preempt_flags"].integer_in(0, 4096, 0));
  ParseProgram(json, &m);
  if (!json["qos_ms"].null()) m.qos_ms = json["qos_ms"].number_in(0, kMaxLatencyUs / 1000, 0);
  json["gpu_sms"].integer_in(1, kMaxUnits, 1);
  m.batch_size = json["batch_size"].integer_in(1, int64_t(1) << 20, 0);
  if (!json["cpu"].null()) m.cpu = json["cpu"].name();  // absent (older artifacts): compiled generic
  if (!json["cpu_features"].null()) m.cpu_features = json["cpu_features"].strings();
  m.batch_latency_us = json["batch_latency_us"].number_in(0, kMaxLatencyUs, 0);
  CheckInvariants(m);
  if (!json["variants"].null()) {  // the smaller batch sizes, smallest first, each checked as the largest is
    int64_t below = 0;
    for (const Json& item : json["variants"].items()) {
      Manifest v = m;
      v.variants.clear();
      v.inputs.clear(), v.outputs.clear(), v.tensors.clear(), v.layers.clear(), v.index_checks.clear();
      v.batch_size = item["batch_size"].integer_in(1, int64_t(1) << 20, 0);
      if (m.batch_size == 0 || v.batch_size <= below || v.batch_size >= m.batch_size)
        throw std::invalid_argument("manifest.variants' batch sizes are not distinct sizes below batch_size, in order");
      below = v.batch_size;
      v.batch_latency_us = item["latency_us"].number_in(0, kMaxLatencyUs, 0);
      ParseProgram(item, &v);
      CheckInvariants(v);
      m.variants.push_back(std::move(v));
    }
  }
  return m;
}

// weights: the .npy members of weights.npz, read by ParseNpy (npz.cc)

}  // namespace

std::map<std::string, std::string> ReadStoredZip(uint64_t size, const ZipRead& read, const std::string& what,
                                                 size_t max_members, const std::set<std::string>& skip) {
  if (size < 22) Corrupt(what, "too short for a zip archive");
  // the end of central directory record, within the last 22 + 65535 bytes (its comment at most that long)
  const uint64_t tail_at = size > 22 + 65535 ? size - 22 - 65535 : 0;
  const std::string tail = read(tail_at, size - tail_at);
  if (tail.size() != size - tail_at) Corrupt(what, "it ended while read");
  size_t eocd = std::string::npos;
  for (size_t at = tail.size() - 22;; --at) {
    if (Le32(tail, at) == 0x06054b50) {
      eocd = at;
      break;
    }
    if (at == 0) break;
  }
  if (eocd == std::string::npos) Corrupt(what, "no zip directory");
  size_t entries = Le16(tail, eocd + 10);
  uint64_t dir_size = Le32(tail, eocd + 12), dir_at = Le32(tail, eocd + 16);
  if (entries > max_members) Corrupt(what, "more than " + std::to_string(max_members) + " members");
  if (dir_at + dir_size > tail_at + eocd) Corrupt(what, "zip directory out of range");
  const std::string b = read(dir_at, dir_size);  // the central directory alone
  if (b.size() != dir_size) Corrupt(what, "it ended while read");
  std::map<std::string, std::string> members;
  size_t at = 0;
  for (size_t i = 0; i < entries; ++i) {
    if (at + 46 > b.size() || Le32(b, at) != 0x02014b50) Corrupt(what, "bad zip directory entry");
    uint16_t method = Le16(b, at + 10);
    uint64_t csize = Le32(b, at + 20), usize = Le32(b, at + 24), offset = Le32(b, at + 42);
    size_t name_len = Le16(b, at + 28), extra_len = Le16(b, at + 30), comment_len = Le16(b, at + 32);
    if (at + 46 + name_len + extra_len + comment_len > b.size()) Corrupt(what, "bad zip directory entry");
    std::string name = b.substr(at + 46, name_len);
    // zip64: the 0xffffffff fields come from the extra field, in order usize, csize, offset
    for (size_t e = at + 46 + name_len; e + 4 <= at + 46 + name_len + extra_len;) {
      uint16_t id = Le16(b, e), len = Le16(b, e + 2);
      size_t p = e + 4, end = p + len;
      if (end > at + 46 + name_len + extra_len) break;
      if (id == 0x0001) {
        if (usize == 0xffffffff && p + 8 <= end) usize = Le64(b, p), p += 8;
        if (csize == 0xffffffff && p + 8 <= end) csize = Le64(b, p), p += 8;
        if (offset == 0xffffffff && p + 8 <= end) offset = Le64(b, p), p += 8;
      }
      e = end;
    }
    at += 46 + name_len + extra_len + comment_len;
    if (method != 0 || csize != usize) {
      TVM_FFI_THROW(TvmschedError) << what << " has a compressed member " << name
                                   << " (tvmsched writes stored members only; refusing to inflate it)";
    }
    const std::string local = offset <= size && size - offset >= 30 ? read(offset, 30) : std::string();
    if (local.size() != 30 || Le32(local, 0) != 0x04034b50) Corrupt(what, "bad local header of " + name);
    uint64_t data_at = offset + 30 + Le16(local, 26) + Le16(local, 28);
    if (data_at > size || usize > size - data_at) Corrupt(what, name + " runs past the end of the file");
    const bool skipped = skip.count(name) > 0;
    std::string data = skipped ? std::string() : read(data_at, usize);
    if (!skipped && data.size() != usize) Corrupt(what, name + " runs past the end of the file");
    if (!members.emplace(name, std::move(data)).second) Corrupt(what, "duplicate member " + name);
  }
  return members;
}

std::map<std::string, std::string> ReadStoredZip(const std::string& bytes, const std::string& what,
                                                 size_t max_members) {
  return ReadStoredZip(
      bytes.size(), [&bytes](uint64_t at, uint64_t n) { return bytes.substr(at, n); }, what, max_members);
}

RegularFile::RegularFile(const std::string& path, const std::string& what) : path_(path), what_(what) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once (and is refused below) instead of waiting
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) TVM_FFI_THROW(TvmschedError) << what << " not found: " << path;
    if (err == EISDIR) TVM_FFI_THROW(TvmschedError) << what << " " << path << " is a directory, not a file";
    TVM_FFI_THROW(TvmschedError) << "cannot open " << what << " " << path << ": " << std::strerror(err);
  }
  try {
    struct stat st;
    if (::fstat(fd_, &st) != 0)
      TVM_FFI_THROW(TvmschedError) << "cannot read " << what << " " << path << ": " << std::strerror(errno);
    if (S_ISDIR(st.st_mode)) TVM_FFI_THROW(TvmschedError) << what << " " << path << " is a directory, not a file";
    if (!S_ISREG(st.st_mode)) {  // a FIFO, socket or device: it could block, or never end
      const char* kind = S_ISFIFO(st.st_mode)                         ? "a FIFO"
                         : S_ISSOCK(st.st_mode)                       ? "a socket"
                         : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                      : "not a regular file";
      TVM_FFI_THROW(TvmschedError) << what << " " << path << " is " << kind << ", not a regular file";
    }
    long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 &&
        static_cast<uint64_t>(st.st_size) > static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)) {
      TVM_FFI_THROW(TvmschedError) << what << " " << path << " is " << st.st_size
                                   << " bytes, more than this machine's memory";
    }
    size_ = static_cast<uint64_t>(st.st_size);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

RegularFile::~RegularFile() { ::close(fd_); }

std::string RegularFile::Read(uint64_t offset, uint64_t n) const {
  std::string bytes(static_cast<size_t>(std::min(n, offset < size_ ? size_ - offset : 0)), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t got = ::pread(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      TVM_FFI_THROW(TvmschedError) << "cannot read " << what_ << " " << path_ << ": " << std::strerror(errno);
    if (got == 0) break;  // shrank while read: the checks that follow see what is there
    done += static_cast<size_t>(got);
  }
  bytes.resize(done);
  return bytes;
}

std::string ReadRegularFile(const std::string& path, const std::string& what) {
  RegularFile file(path, what);
  return file.Read(0, file.size());
}

bool SignatureRequired() {
  const char* value = std::getenv("TVMSCHED_REQUIRE_SIGNATURE");
  return value != nullptr && *value != '\0' && std::string(value) != "0";
}

/*! \brief `body()`, where a bad manifest or bad weights (its exceptions) become one line naming `path`. */
template <typename F>
void AsCorrupt(const std::string& path, F body) {
  try {
    body();
  } catch (const std::invalid_argument& err) {
    TVM_FFI_THROW(TvmschedError) << path << " is a corrupt artifact: bad manifest or weights (" << Printable(err.what())
                                 << ")";
  } catch (const ffi::Error& err) {
    TVM_FFI_THROW(TvmschedError) << path << " is a corrupt artifact: bad manifest or weights ("
                                 << Printable(err.message()) << ")";
  }
}

/*! \brief `out`'s weights from its weights.npz (`npz`, freed as it is read), each checked against its manifest. */
static void ReadWeights(std::string& npz, ArtifactContents* out, const std::string& path,
                        std::pair<int, int> only_layers) {
  std::set<std::string> wanted;  // (only_layers: the weights those layers read; empty: every one)
  const std::vector<LayerSpec>& layers = out->manifest.layers;
  for (int i = std::max(0, only_layers.first); only_layers.first >= 0 && i <= only_layers.second; ++i) {
    if (i < static_cast<int>(layers.size())) wanted.insert(layers[i].inputs.begin(), layers[i].inputs.end());
  }
  AsCorrupt(path, [&] {
    auto arrays = ReadStoredZip(npz, "weights.npz", 65535);
    std::string().swap(npz);  // (its checksum was checked; its arrays are parsed from `arrays`, each freed once parsed)
    std::vector<const Manifest*> programs{&out->manifest};
    for (const Manifest& v : out->manifest.variants) programs.push_back(&v);
    for (const Manifest* program : programs) {
      for (const auto& [id, spec] : program->tensors) {
        if (spec.kind != "weight" || (!wanted.empty() && !wanted.count(id))) continue;
        if (auto seen = out->weights.find(id); seen != out->weights.end()) {  // shared by two sizes: the same array
          bool same_dtype = seen->second.dtype.code == spec.dtype.code && seen->second.dtype.bits == spec.dtype.bits;
          if (seen->second.shape != spec.shape || !same_dtype)
            throw std::invalid_argument("weight " + id + " does not match its shape or dtype");
          continue;
        }
        auto found = arrays.find(id + ".npy");
        if (found == arrays.end()) throw std::invalid_argument("weights.npz lacks " + id);
        HostArray array = ParseNpy(found->second, id);
        arrays.erase(found);
        bool same_dtype = array.dtype.code == spec.dtype.code && array.dtype.bits == spec.dtype.bits;
        if (array.shape != spec.shape || !same_dtype)
          throw std::invalid_argument("weight " + id + " does not match its shape or dtype");
        out->weights.emplace(id, std::move(array));
      }
    }
  });
}

ArtifactContents ReadArtifact(const std::string& path, const TrustedKeys& trusted, bool for_loading, bool with_weights,
                              std::pair<int, int> only_layers) {
  if (for_loading && trusted.empty() && SignatureRequired()) {
    TVM_FFI_THROW(TvmschedError)
        << "refusing to load " << path << " without a trusted key: TVMSCHED_REQUIRE_SIGNATURE is set, "
        << "so only artifacts signed by a trusted key are loaded (--trust KEY.pub, trusted_keys=)";
  }
  // each member read from the file on its own (no copy of the whole file); weights.npz only when its weights are
  RegularFile file(path, "artifact");
  auto members = ReadStoredZip(
      file.size(), [&file](uint64_t at, uint64_t n) { return file.Read(at, n); }, path, 16,
      with_weights ? std::set<std::string>{} : std::set<std::string>{"weights.npz"});
  for (const char* name : {"manifest.json", "kernels.so", "weights.npz", "checksums.json"}) {
    if (!members.count(name)) Corrupt(path, std::string("there is no item named '") + name + "' in the archive");
  }
  std::string signer =
      trusted.empty() ? "" : trusted.Verify(path, members["signature.json"], members["checksums.json"]);
  ffi::String error;
  try {
    CheckJsonDepth(members["checksums.json"], "checksums.json", kMaxJsonDepth);
  } catch (const std::invalid_argument& err) {
    Corrupt(path, err.what());
  }
  ffi::Any sums = ffi::json::Parse(ffi::String(members["checksums.json"]), &error);
  for (const char* name : {"manifest.json", "kernels.so", "weights.npz"}) {
    if (!with_weights && std::string(name) == "weights.npz") continue;  // (not read: nothing of it is used)
    std::string expected;
    try {
      expected = error.empty() ? Json(sums, "checksums")[name].str() : "";
    } catch (const std::invalid_argument&) {
    }
    if (Sha256Hex(members[name]) != expected)
      TVM_FFI_THROW(TvmschedError) << path << " is corrupt: checksum mismatch in " << name;
  }
  ArtifactContents out;
  AsCorrupt(path, [&] { out.manifest = ParseManifest(members["manifest.json"]); });
  int version = out.manifest.schema_version;
  if (version > kSchemaVersion) {
    TVM_FFI_THROW(TvmschedError) << path << " has artifact schema version " << version
                                 << ", newer than this tvmsched reads (" << kSchemaVersion << "); upgrade tvmsched";
  }
  if (version < kSchemaVersion) {
    TVM_FFI_THROW(TvmschedError) << path << " has artifact schema version " << version
                                 << "; this tvmsched reads version " << kSchemaVersion << " only (recompile the model)";
  }
  if (with_weights) ReadWeights(members["weights.npz"], &out, path, only_layers);
  out.signer = signer;
  out.manifest_json = std::move(members["manifest.json"]);
  out.kernels = std::move(members["kernels.so"]);
  return out;
}

std::vector<int64_t> BatchSizes(const Manifest& manifest) {
  std::vector<int64_t> sizes;
  if (manifest.batch_size == 0) return sizes;
  for (const Manifest& v : manifest.variants) sizes.push_back(v.batch_size);
  sizes.push_back(manifest.batch_size);
  return sizes;
}

void SelectBatch(ArtifactContents* contents, int64_t batch, const std::string& path) {
  Manifest& m = contents->manifest;
  if (batch == m.batch_size) return;
  auto found =
      std::find_if(m.variants.begin(), m.variants.end(), [&](const Manifest& v) { return v.batch_size == batch; });
  if (found == m.variants.end()) {
    std::ostringstream sizes;
    for (int64_t size : BatchSizes(m)) sizes << (sizes.tellp() ? ", " : "") << size;
    TVM_FFI_THROW(TvmschedError) << path << " is not compiled at batch size " << batch
                                 << " (its sizes: " << (m.batch_size ? sizes.str() : std::string("none")) << ")";
  }
  Manifest chosen = std::move(*found);
  m = std::move(chosen);
  for (auto it = contents->weights.begin(); it != contents->weights.end();) {
    it = m.tensors.count(it->first) ? std::next(it) : contents->weights.erase(it);
  }
}

void CutLayers(ArtifactContents* contents, int first, int last, const std::string& path) {
  Manifest& m = contents->manifest;
  const int n = static_cast<int>(m.layers.size());
  if (first < 0 || last < first || last >= n) {
    TVM_FFI_THROW(TvmschedError) << path << ": layers " << first << " to " << last << " are not a part of its " << n
                                 << " layers (0 to " << n - 1 << ")";
  }
  std::map<std::string, int> writer;  // activation -> the layer that writes it
  for (int i = 0; i < n; ++i) {
    for (const std::string& out : m.layers[i].outputs) writer[out] = i;
  }
  std::set<std::string> used;                 // every tensor its layers touch
  std::vector<std::string> crossing_in, out;  // earlier layers' activations it reads; what later layers read of its
  std::set<std::string> read_later;
  for (int i = last + 1; i < n; ++i) read_later.insert(m.layers[i].inputs.begin(), m.layers[i].inputs.end());
  for (int i = first; i <= last; ++i) {
    for (const std::string& in : m.layers[i].inputs) {
      used.insert(in);
      auto w = writer.find(in);
      if (w != writer.end() && w->second < first &&
          std::find(crossing_in.begin(), crossing_in.end(), in) == crossing_in.end()) {
        crossing_in.push_back(in);
      }
    }
    for (const std::string& o : m.layers[i].outputs) {
      used.insert(o);
      if (read_later.count(o) && std::find(out.begin(), out.end(), o) == out.end()) out.push_back(o);
    }
  }
  std::set<std::string> names;  // binding names, each once
  std::vector<Binding> inputs, outputs;
  for (const Binding& b : m.inputs) {
    if (used.count(b.tensor)) inputs.push_back(b), names.insert(b.name);
  }
  for (const Binding& b : m.outputs) {
    auto w = writer.find(b.tensor);
    if (w != writer.end() && w->second >= first && w->second <= last) outputs.push_back(b), names.insert(b.name);
  }
  auto bind = [&](std::vector<Binding>* list, const std::string& tensor) {
    if (std::any_of(list->begin(), list->end(),
                    [&](const Binding& b) { return b.name == tensor && b.tensor == tensor; }))
      return;  // (a model output of that name: later parts read it under it)
    if (!names.insert(tensor).second) {
      TVM_FFI_THROW(TvmschedError) << path << ": cannot be split at layers " << first << " to " << last
                                   << ": the activation " << tensor << " has a model input's or output's name";
    }
    list->push_back({tensor, tensor});
  };
  for (const std::string& t : crossing_in) bind(&inputs, t);
  for (const std::string& t : out) bind(&outputs, t);
  std::vector<IndexCheckSpec> checks;  // the index checks its layers write
  for (const IndexCheckSpec& c : m.index_checks) {
    if (used.count(c.tensor)) checks.push_back(c);
  }
  std::map<std::string, TensorSpec> tensors;
  for (const std::string& t : used) tensors[t] = m.tensors.at(t);
  for (const std::string& t : crossing_in) tensors[t].kind = "input";  // copied in like a model input
  std::vector<LayerSpec> layers(m.layers.begin() + first, m.layers.begin() + last + 1);
  for (int i = 0; i < static_cast<int>(layers.size()); ++i) layers[i].index = i;
  m.inputs = std::move(inputs);
  m.outputs = std::move(outputs);
  m.tensors = std::move(tensors);
  m.layers = std::move(layers);
  m.index_checks = std::move(checks);
  m.variants.clear();
  m.batch_latency_us = 0;
  for (auto it = contents->weights.begin(); it != contents->weights.end();) {
    it = m.tensors.count(it->first) ? std::next(it) : contents->weights.erase(it);
  }
}

}  // namespace tvmsched
