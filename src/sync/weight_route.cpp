#include "sync/weight_route.h"

#include <fmt/format.h>

#include "core/log.h"

namespace slimpi {

bool sliced_weight_sync(const Deck& deck, const WorldLayout& layout) {
  const std::string& route = deck.get_string("rollout.weight_sync_route");
  if (route != "auto") return route == "sliced";
  if (deck.get_string("rollout.precision") == "fp8") return false;  // fp8 quantises whole tensors (sync/fp8_weights.h)
  if (deck.get_int("parallel.pipeline_parallel") > 1) return false;  // the plan is not built for stages
  // One-rank engines take the whole model either way; the broadcast's tree beats the
  // plan's one send per engine there (perf/bench_weight_sync.cpp).
  return layout.engine_size > 1;
}

std::unique_ptr<WeightRoute> make_weight_route(const WeightRouteParts& p) {
  const Deck& deck = p.deck;
  const WorldLayout& layout = p.world.layout();
  const bool fp8 = p.rl && deck.get_string("rollout.precision") == "fp8";
  if (p.rl && layout.placement == Placement::Colocate && deck.get_string("rollout.weight_sync") == "delta")
    log::info("rollout.weight_sync = \"delta\" ({}) has nothing to do: colocated engines take the trainer's weights "
              "in place, with no sync", deck.source("rollout.weight_sync"));
  if (!p.rl || layout.placement != Placement::Split) return make_colocated_route(p.policy, p.engine, fp8);
  const int64_t bucket = deck.get_int("rollout.weight_sync_bucket_mb") << 20;
  const bool sliced = sliced_weight_sync(deck, layout);
  const DeltaSyncConfig delta{deck.get_string("rollout.weight_sync") == "delta",
                              deck.get_int("rollout.delta_anchor_interval")};
  const bool check = deck.get_bool("rollout.check_weight_update");
  const int holders = layout.trainer_tensor * layout.trainer_expert;
  log::info("weight sync: {} (rollout.weight_sync_route = \"{}\", {})", sliced
            ? fmt::format("sliced: each engine rank receives its shard from the {} trainer rank{} holding one",
                          holders, holders > 1 ? "s" : "")
            : std::string("broadcast: trainer rank 0 sends the whole model to every rollout rank"),
            deck.get_string("rollout.weight_sync_route"), deck.source("rollout.weight_sync_route"));
  return sliced ? make_sliced_route(p, bucket, delta, check) : make_broadcast_route(p, bucket, delta, check);
}

}  // namespace slimpi
