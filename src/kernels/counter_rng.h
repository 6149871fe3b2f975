// Counter-based random numbers: a uniform in [0, 1) that is a pure function of its
// coordinates (no state), so a sample's draws do not depend on which other requests
// share its batch, on the engine that runs it, or on preemption and recompute.
//   seed = mix(run seed, step, prompt index)   (per group, by the caller)
//   u    = uniform(seed, sample index, token position)
// mix is SplitMix64's finaliser (a bijection on 64 bits); the top 53 bits make the double.
//
// One definition, two executors: the functions are templates over the 64-bit word, so
// the host sampler runs them on uint64_t and the device sampler (kernels/sampling.h,
// sample_tokens_tensor) on int64 tensors, where +, ^ and * wrap exactly as on uint64_t
// and logical_shift_right is supplied by the tensor word type. Equal coordinates give
// equal bits on both.
#pragma once

#include <cstdint>

namespace slimpi {

inline uint64_t logical_shift_right(uint64_t x, int n) { return x >> n; }

template <class Word>
Word splitmix64(Word x) {
  x = x + 0x9e3779b97f4a7c15ULL;
  x = (x ^ logical_shift_right(x, 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ logical_shift_right(x, 27)) * 0x94d049bb133111ebULL;
  return x ^ logical_shift_right(x, 31);
}

template <class Word>
Word mix_words(Word a, Word b, Word c) {
  return splitmix64(splitmix64(splitmix64(a) ^ b) ^ c);
}

inline uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c) { return mix_words(a, b, c); }

// The 53 random bits of draw (seed, sample, position); u = bits * 2^-53.
template <class Word>
Word counter_bits(Word seed, Word sample, Word position) {
  return logical_shift_right(mix_words(seed, sample, position), 11);
}

constexpr double kCounterUnit = 1.0 / 9007199254740992.0;  // 2^-53

inline double counter_uniform(uint64_t seed, uint64_t sample, uint64_t position) {
  return double(counter_bits<uint64_t>(seed, sample, position)) * kCounterUnit;
}

}  // namespace slimpi
