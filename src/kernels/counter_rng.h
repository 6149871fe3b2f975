// Counter-based random numbers: a uniform in [0, 1) that is a pure function of its
// coordinates (no state), so a sample's draws do not depend on which other requests
// share its batch, on the engine that runs it, or on preemption and recompute.
//   seed = mix(run seed, step, prompt index)   (per group, by the caller)
//   u    = uniform(seed, sample index, token position)
// mix is SplitMix64's finaliser (a bijection on 64 bits); 53 bits make the double.
#pragma once

#include <cstdint>

namespace slimpi {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c) {
  return splitmix64(splitmix64(splitmix64(a) ^ b) ^ c);
}

inline double counter_uniform(uint64_t seed, uint64_t sample, uint64_t position) {
  return double(mix_seed(seed, sample, position) >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace slimpi
