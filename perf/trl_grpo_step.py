"""TRL's GRPOTrainer on the workload of perf/qwen3_shape_step.sh, for its `trl` layout.

A Qwen3-0.6B-shaped Qwen3ForCausalLM (the shape slimpi's side uses, random weights,
fp32, on the CPU), GRPO with 4 prompts x 4 generations x 32 new tokens per step (one
optimizer step per 16 samples, as slimpi's global_batch_size 16), no reference model
(beta 0, as slimpi's deck without a KL loss), gradient checkpointing (slimpi's side runs
train.recompute = full), 2 steps; the prompts are the first of
inputs/data/addition_sft.jsonl, the tokenizer the small qwen2-style one of
tests/fixtures/hf/qwen2_with_tokenizer (random weights sample ids it does not hold:
they decode to nothing, and the reward is 0 for every sample, as exact match gives
slimpi's side). Prints the second step's time; the caller measures the peak RSS.

Usage: <venv with trl>/bin/python perf/trl_grpo_step.py REPO_ROOT
"""
import json
import sys
import time

import torch
from datasets import Dataset
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

root = sys.argv[1]
torch.manual_seed(1234)
torch.set_num_threads(2)
config = Qwen3Config(vocab_size=151936, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                     num_key_value_heads=8, head_dim=128, intermediate_size=3072, tie_word_embeddings=True,
                     max_position_embeddings=128, use_cache=True)
model = Qwen3ForCausalLM(config).to(torch.float32)
tokenizer = AutoTokenizer.from_pretrained(f"{root}/tests/fixtures/hf/qwen2_with_tokenizer")
tokenizer.padding_side = "left"
prompts = [json.loads(line)["prompt"] for line in open(f"{root}/inputs/data/addition_sft.jsonl")][:8]
dataset = Dataset.from_list([{"prompt": p} for p in prompts])


def zero_reward(completions, **kwargs):
    return [0.0 for _ in completions]


class StepTimes(TrainerCallback):
    def __init__(self):
        self.times, self.start = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.start)


args = GRPOConfig(output_dir="/tmp/trl_grpo_step", per_device_train_batch_size=16, num_generations=4,
                  max_completion_length=32, gradient_accumulation_steps=1, max_steps=2, learning_rate=1e-6,
                  beta=0.0, gradient_checkpointing=True, use_cpu=True, bf16=False, logging_steps=1,
                  save_strategy="no", report_to="none", seed=1234, shuffle_dataset=False)
times = StepTimes()
trainer = GRPOTrainer(model=model, reward_funcs=zero_reward, args=args, train_dataset=dataset,
                      processing_class=tokenizer, callbacks=[times])
trainer.train()
print(f"trl_grpo_step: step times (s) {' '.join(f'{t:.1f}' for t in times.times)}")
