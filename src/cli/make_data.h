// `slimpi make-data TASK --out FILE [--n N] [--seed S]`: JSONL for the built-in
// verifiable tasks, a pure function of (task, n, seed) on any machine (draws come
// from the counter-based RNG, never from a standard-library distribution).
//   addition        {"prompt": "57+468=", "response": "525", "label": "525"}
//                   1-3 digit operands; the sum written with its digits reversed
//                   (least significant first), which small causal models learn well
//   multiplication  {"prompt": "12*34=", ...}: 1-2 digit operands, product reversed
//   countdown       {"prompt": "Using the numbers [3, 7, 9, 2] once each with + - * /,
//                   make 23. Answer with the expression.", "label":
//                   "{\"target\": 23, \"numbers\": [3, 7, 9, 2]}"} (reward.style countdown);
//                   the target is the value of a random expression over the numbers
//   coding          {"prompt": "Make test.py pass.", "label": "{\"visible\": [[1, 8, \"1*3+5\"],
//                   [2, 11, \"2*3+5\"]], \"hidden\": [[0, 5], ...]}"}: the coding agent's task
//                   (f(x) = x*A + B in sol.py; inputs/agents/coding_agent.py), the response a
//                   whole episode; 72 of the 90 (A, B) pairs
//   coding_heldout  the same task on the other 18 pairs ((A + B) % 5 == 0), for evaluation
// "response" is an SFT target; "label" is what the reward compares with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slimpi {

// The tasks, sorted (a registry: a new task is a line function and one add()).
std::vector<std::string> data_tasks();
// The lines of the file (each a JSON object, no trailing newline).
std::vector<std::string> make_task_data(const std::string& task, int64_t n, uint64_t seed);

}  // namespace slimpi
