// numpy's file formats, as far as the engine and its embedders need them: .npy arrays (C order, little-endian
// numbers and bools) and .npz archives of stored (uncompressed) .npy members, as np.savez writes them. The artifact's
// weights.npz is read with ParseNpy; examples/cpp/run.cc reads its inputs and writes its outputs with LoadNpz/SaveNpz.
#ifndef TVMSCHED_NPZ_H_
#define TVMSCHED_NPZ_H_

#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tvmsched/artifact.h"

namespace tvmsched {

/*! \brief An array from .npy bytes; std::invalid_argument with one line naming `what` if it is not one this reads. */
HostArray ParseNpy(const std::string& bytes, const std::string& what);

/*! \brief The .npy bytes of a contiguous host tensor. */
std::string WriteNpy(const tvm::ffi::Tensor& tensor);

/*! \brief Every array of the .npz file at `path`, keyed by member name less ".npy" (one-line errors). */
tvm::ffi::Map<tvm::ffi::String, tvm::ffi::Tensor> LoadNpz(const std::string& path);

/*! \brief Write `arrays` to `path` as an .npz (stored members NAME.npy, in the map's order). */
void SaveNpz(const std::string& path, const tvm::ffi::Map<tvm::ffi::String, tvm::ffi::Tensor>& arrays);

/*! \brief A zip archive of stored members (name, bytes), in order, with CRC-32s (np.load and zipfile read it). */
std::string StoredZip(const std::vector<std::pair<std::string, std::string>>& members);

}  // namespace tvmsched

#endif  // TVMSCHED_NPZ_H_
