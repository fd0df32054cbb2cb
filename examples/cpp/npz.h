/*!
 * \file npz.h
 * \brief Just enough of numpy's file formats for the examples: .npy arrays (C order, little-endian)
 *        and .npz archives of stored (uncompressed) .npy members, as np.savez writes them.
 *
 * Reading uses the engine's own zip reader (tvmsched::ReadStoredZip); writing produces a plain
 * stored zip with CRC-32s, which np.load reads. Problems are std::runtime_error with one line.
 */
#ifndef TVMSCHED_EXAMPLES_NPZ_H_
#define TVMSCHED_EXAMPLES_NPZ_H_

#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace npz {

/*! \brief A host tensor from .npy bytes (`what` names it in errors). */
tvm::ffi::Tensor ParseNpy(const std::string& bytes, const std::string& what);

/*! \brief The .npy bytes of a contiguous host tensor. */
std::string WriteNpy(const tvm::ffi::Tensor& tensor);

/*! \brief Every array of the .npz file at `path`, keyed by member name less ".npy". */
tvm::ffi::Map<tvm::ffi::String, tvm::ffi::Tensor> Load(const std::string& path);

/*! \brief Write `arrays` to `path` as an .npz (stored members NAME.npy, in the map's order). */
void Save(const std::string& path, const tvm::ffi::Map<tvm::ffi::String, tvm::ffi::Tensor>& arrays);

/*! \brief A zip archive of stored members (name, bytes), in order. */
std::string StoredZip(const std::vector<std::pair<std::string, std::string>>& members);

/*! \brief CRC-32 (ISO-HDLC, as zip uses). */
uint32_t Crc32(const std::string& data);

}  // namespace npz

#endif  // TVMSCHED_EXAMPLES_NPZ_H_
