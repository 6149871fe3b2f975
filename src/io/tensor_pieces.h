// Tensor pieces — per-rank I/O of tensors stored whole (trainer_state.h5 under tensor
// and expert parallelism and the distributed optimizer): each rank writes and reads
// only the elements it holds, as hyperslabs of the whole tensors' datasets, so that no
// rank gathers, or ever holds, more than its own part. StoredWhole::span_of
// (model/tensor_shard.h) places a piece in its whole tensor; the file itself is the same
// as one rank writing whole tensors (io/tensor_io.h), whatever layout wrote it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/named_tensor.h"
#include "io/h5.h"
#include "model/tensor_shard.h"

namespace slimpi {

// A run of one local tensor's elements.
struct TensorPiece {
  std::string name;                  // the stored tensor's name ("exp_avg/<parameter>", ...)
  std::vector<int64_t> local_shape;  // the local tensor's shape (a shard's, under model parallelism)
  int64_t begin = 0;                 // the run's first element in the local tensor (row-major)
  at::Tensor values;                 // [n] contiguous, on the CPU: elements [begin, begin + n)
};

// A whole local tensor as one piece, on the CPU (a view where it already is there).
TensorPiece whole_piece(const std::string& name, const at::Tensor& t);

// Collective over `file`'s communicator (a serial file: this rank alone). Creates in
// group `loc` one dataset for every tensor that any rank declares (`declared`: local
// tensors, whose names, dtypes and, through `stored`, whole shapes must agree across
// ranks), then writes this rank's `pieces` (independent transfers; their padded
// vocabulary elements dropped). A piece with a NaN or inf is refused. An error in this
// rank's writes is thrown after every collective call of the function has been made, so
// that no rank is left waiting; the file then holds holes and must be discarded.
void write_tensor_pieces(const h5::File& file, hid_t loc, const StoredWhole& stored,
                         const std::vector<NamedTensor>& declared, const std::vector<TensorPiece>& pieces);

// Fills each piece's values from group `loc` (this process alone; the padded vocabulary
// elements get zeros). Each stored tensor's shape is checked against the whole shape of
// the piece's local tensor, its dtype against the values' (any_float: any floating
// dtype, converted). Throws slimpi::Error naming the tensor before any piece is read.
// The data go straight into each piece's values where those are a contiguous CPU tensor
// of the stored dtype (a view of the destination: no second copy), else through a
// buffer of that one piece.
void read_tensor_pieces(hid_t loc, const StoredWhole& stored, std::vector<TensorPiece>& pieces, bool any_float);

}  // namespace slimpi
