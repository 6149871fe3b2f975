// Deck keys of the world layout and the parallel sizes:
// declared beside the code that reads them, collected by deck_keys() (cli/deck_keys.cpp).
#include "deck/key_tables.h"

namespace slimpi {

std::vector<KeySpec> parallel_keys() {
  return {
      // [parallel]
      choice_key("parallel.placement", "split", {"split", "colocate"},
                 "split: trainer and rollout ranks apart; colocate: every rank does both"),
      int_key("parallel.trainer_ranks", 0, 0, 1e7, "ranks",
              "trainer ranks in split placement (0 = world size minus rollout_ranks, or half)"),
      int_key("parallel.rollout_ranks", 0, 0, 1e7, "ranks",
              "rollout ranks in split placement (0 = world size minus trainer_ranks)"),
      choice_key("parallel.comm_backend", "auto", {"auto", "mpi", "nccl"},
                 "collective backend; auto = NCCL when every rank has a GPU, else MPI"),
      int_key("parallel.tensor_parallel", 1, 1, 1e6, "ranks",
              "split the trainer's dense layers over groups of this many trainer ranks (Megatron's tensor "
              "parallelism: heads, MLP columns and vocabulary rows; tensor fastest, then context, expert, data)"),
      int_key("parallel.context_parallel", 1, 1, 1e6, "ranks",
              "split every packed sequence over groups of this many trainer ranks (Megatron's context "
              "parallelism: 2c chunks, rank i holding chunks i and 2c-1-i; attention gathers keys and values)"),
      int_key("parallel.pipeline_parallel", 1, 1, 1e6, "ranks",
              "split the trainer's layers into this many pipeline stages, one a rank (1F1B over the micro-batches; "
              "tensor, then context, then pipeline, then data)"),
      string_key("parallel.pipeline_layers", "",
                 "with pipeline_parallel: the layers of each stage, comma-separated (e.g. \"5,3\"); empty: as "
                 "even as they go, the earlier stages one more"),
      bool_key("parallel.sequence_parallel", false,
               "with tensor parallelism: norms and residuals hold 1/tensor_parallel of the tokens per rank "
               "(Megatron's sequence parallelism)"),
      int_key("parallel.expert_parallel", 1, 1, 1e6, "ranks",
              "MoE: shard each layer's experts over groups of this many trainer ranks (tokens exchanged all-to-all)"),
      float_key("parallel.timeout_s", 600.0, 1.0, 1e7, "s",
                "a blocking collective waiting longer than this aborts the job, naming it")
  };
}

}  // namespace slimpi
