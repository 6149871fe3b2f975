// Disaggregated routing (rollout.prefill_ranks = n > 0): one call's prompt groups served
// by two pools of one-rank engines, prefill and decode, as SGLang's PD disaggregation.
//
// The last n ranks of the rollout communicator are prefill engines
// (EngineConfig::prefill_only): they compute each prompt up to its last token and send
// its KV rows (rollout/kv_transfer.h) straight to the group's decode engine. The other
// ranks, rollout rank 0 (the router) among them, are decode engines: they write the rows
// into their own blocks, run the last prompt token, fork the group and decode it, and
// return whole groups to the router. Prefill ranks never decode, decode ranks never
// prefill a prompt (they do recompute a sequence they preempted).
// Dispatch: each group goes to a decode engine by route_rollout's rule (the fewest
// outstanding tokens among engines under 2·max_running outstanding sequences) and to the
// prefill engine with the fewest outstanding prompt tokens; the router sends that
// prefill engine (group, decode rank).
// Messages (tags of their own): router -> prefill: (group, decode rank) int64 pairs, an
// empty one = done; prefill -> decode: one KvTransfer; decode -> router: whole groups;
// router -> decode: done, sent once every group is back (no transfer is still on its
// way). The router's sends are posted (MPI_Isend), and the engines' blocking sends go
// to ranks that receive that tag in every state where they wait (the router waits for
// transfers and results at once), so no cycle of waits forms.
// Every rank leaves a call through one (sleeping) barrier, so the messages of two calls
// in a row never meet.
// Tokens: the decode engine samples from logits of the same prompt KV, so a disaggregated
// call gives route_rollout's samples (the counter-based sampler); on rank 0, ordered by
// (group, sample). Collective over the rollout communicator.
#pragma once

#include <mpi.h>

#include <functional>
#include <vector>

#include "rollout/engine.h"
#include "rollout/router.h"

namespace slimpi {

class EpisodeRunner;

// Whether rollout rank `rank` of `size` is a prefill engine when the last `n_prefill` are.
inline bool is_prefill_rank(int rank, int size, int64_t n_prefill) { return rank >= size - n_prefill; }

// This rank's place in a disaggregated call over `rollout` (both routers): throws unless
// there is at least one engine of each pool.
struct PdRanks {
  int rank = 0, size = 1, n_decode = 1;
  bool prefill = false;  // this rank is a prefill engine
};
PdRanks pd_ranks(MPI_Comm rollout, int64_t n_prefill);

// `engine`: this rank's engine (prefill_only on the prefill ranks). `pd` gets this rank's
// transfer times (kv_send_s, kv_receive_s: MPI included) and its pool's busy and wall
// seconds; the engine keeps the rest of its counters.
std::vector<Sample> route_disaggregated(Engine& engine, MPI_Comm rollout, int64_t n_prefill, int64_t max_running,
                                        const std::vector<GenerationRequest>& requests,
                                        const std::function<void(const RouterProgress&)>& on_progress,
                                        EngineStats& pd);

// What a generation call on every engine rank runs. Without disaggregation (n_prefill =
// 0): route_rollout over this rank's worker, its episode runner or else its engine. With
// it: route_disaggregated_episodes when the call runs episodes (`episodic`, said on
// every rank: the prefill ranks hold no runner), route_disaggregated otherwise.
// `episodes`: this rank's runner over `engine` (rollout.environment), null without one.
// `pd` as route_disaggregated's (untouched without disaggregation).
std::vector<Sample> route_groups(Engine& engine, EpisodeRunner* episodes, bool episodic, MPI_Comm comm,
                                 int64_t n_prefill, int64_t max_running, const std::vector<GenerationRequest>& requests,
                                 const std::function<void(const RouterProgress&)>& on_progress, EngineStats& pd);
// `cfg` for rollout rank `rank` of `size`: a prefill engine when it is one of the last n_prefill.
EngineConfig engine_config_of_rank(EngineConfig cfg, int rank, int size, int64_t n_prefill);

}  // namespace slimpi
