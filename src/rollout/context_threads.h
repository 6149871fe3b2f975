// Threads of an episode's contexts (EnvReply::resume_context). An episode that leaves one
// conversation for another and comes back to it (a parent agent waiting on its sub-agent)
// runs the return as a new context that opens with the left context's tokens as they are,
// so while it runs the trajectory holds those tokens twice: once trained (the first
// context) and once as the later context's opening (loss mask 0), as the engine runs its
// latest context as a sequence of its own (rollout/episode_runner.h).
//
// join_resumed_contexts() keeps each thread once when the episode finishes: a context
// continued by a later one is dropped, and the copy in the later one takes its loss mask,
// log-probs, weight versions and sampling support. The trainer computes every context
// as a sequence of its own (train/packed_batch.h) and causal attention gives a token the
// same log-prob at the same place in a longer sequence, so the joined sample trains on the
// same tokens with the same log-probs, each once. The threads keep the order of their first
// contexts (the prompt's first), so the sample still begins with its prompt.
#pragma once

#include <slimpi/sample.h>

#include <cstdint>
#include <vector>

namespace slimpi {

// continued_from[c]: the context that context c continues (an earlier one, each continued at
// most once, whose tokens context c begins with), or -1; c numbers the contexts in order, 0
// the first (the prompt's), one entry per context at most (missing ones are -1). The sample's
// per-response-token rollout fields must be complete and its routing trace empty (a split
// trajectory has none); trainer fields are not kept.
void join_resumed_contexts(Sample& s, const std::vector<int64_t>& continued_from);

}  // namespace slimpi
