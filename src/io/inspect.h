// `slimpi inspect FILE.h5`: a short human summary of any slimpi HDF5 file (or any
// HDF5 file): root attributes, then every dataset with its shape, type and, for
// numeric 1-D datasets, min / mean / max (NaN-aware); CSR groups are shown as
// rows with mean/max row length. Reads serially; safe on a file a job is writing.
#pragma once

#include <string>

namespace slimpi {

std::string inspect_h5(const std::string& path);

}  // namespace slimpi
