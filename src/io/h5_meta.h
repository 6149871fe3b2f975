// Self-describing attributes every slimpi HDF5 file carries on its root group:
// kind ("slimpi rollouts", "slimpi metrics"), slimpi_version, created_utc, deck.
#pragma once

#include "io/h5.h"

namespace slimpi::h5 {

void write_file_meta(const File& file, const std::string& kind, const std::string& deck_text);

}  // namespace slimpi::h5
