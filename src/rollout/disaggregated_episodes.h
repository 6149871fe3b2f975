// Disaggregated episodes (rollout.prefill_ranks = n > 0 with rollout.environment, agents
// included): the episodes of one call's groups run on the decode engines, and the turns
// whose context a decode engine would compute from its start are prefilled by the prefill
// engines, as SGLang's PD disaggregation serves each new request: a turn that opens a
// context (an episode's first turn after its reset, the first turn of a new context; not
// a resumed earlier thread, whose tokens the decode engine's prefix cache normally holds),
// and, on engines without a prefix cache (a hybrid model's), every turn. The other turns of
// a context run on their decode engine alone, which computes only each observation's tokens
// while its prefix cache holds the context (what it evicted, or a weight update cleared, it
// computes again itself: the same tokens, more work).
//
// Ranks: the last n of the rollout communicator prefill, the others decode; rollout rank
// 0 routes (and decodes). Groups go to the decode engines as route_rollout hands them out
// (over a communicator of the decode ranks: its dispatch, its whole-group returns); each
// decode engine runs its groups' episodes (rollout/episode_runner.h) with its own
// environment. Such a turn (EpisodeRunner::set_context_prefill) leaves as its sequence's
// tokens to the prefill engine with the fewest of this decode engine's tokens outstanding;
// that engine computes every position but the last and sends the KV rows back
// (rollout/kv_transfer.h); the turn then enters the decode engine with them
// (Engine::add_prefilled), which runs the last token and samples the turn. A turn whose
// sequence is one already away on its decode engine (a group's samples opening the same
// context at once: their resets, a sub-agent's first request) sends nothing and shares
// those rows; one that comes later sends its own, which the prefill engine's prefix cache
// serves once the first has been handed out.
// Messages (tags of their own, over the rollout communicator): decode -> prefill: int64
// (ticket, decode rank, tokens...), and () once that decode engine has every ticket back
// and no episode left; prefill -> decode: one KvTransfer whose group_index is the ticket.
// Both sides post their sends (MPI_Isend) and go on receiving, so neither waits on the
// other; a prefill engine leaves once every decode engine has said it is done, and a
// decode engine says so only after its last ticket came back, so no transfer is ever on
// its way when a call ends. Every rank leaves through one (sleeping) barrier. A decode
// engine with nothing to run but turns away naps (up to 1 ms at a time), and ends the
// job, naming the prefill rank, when one has been away past parallel.timeout_s.
// Tokens: each turn samples from the same context's KV under the counter-based sampler,
// so the episodes are those of plain engines with a deterministic environment (the KV
// values agree to fp32 round-off, as for groups). Prefill engines run no environment.
// Collective over the rollout communicator.
#pragma once

#include <mpi.h>

#include <functional>
#include <vector>

#include "rollout/engine.h"
#include "rollout/router.h"

namespace slimpi {

class EpisodeRunner;

// `engine`: this rank's engine (prefill_only on the prefill ranks). `episodes`: this
// decode rank's runner over `engine` (null on the prefill ranks, which run none). `pd`
// gets this rank's seconds: kv_send_s (a prefill engine gathering, encoding and posting
// rows; the sends complete while it works), kv_receive_s (a decode engine receiving and
// queueing them), prefill_busy_s (its iterations), decode_busy_s (the runner's steps while
// its engine had work: the environment's replies taken in them included), and each pool's
// wall seconds in the call.
// Returns every sample on rollout rank 0, ordered by (group, sample), nothing elsewhere.
std::vector<Sample> route_disaggregated_episodes(Engine& engine, EpisodeRunner* episodes, MPI_Comm rollout,
                                                 int64_t n_prefill, int64_t max_running,
                                                 const std::vector<GenerationRequest>& requests,
                                                 const std::function<void(const RouterProgress&)>& on_progress,
                                                 EngineStats& pd);

}  // namespace slimpi
