#!/usr/bin/python3
"""A multi-turn episode (or any sample) of a slimpi run as a readable transcript: the
prompt, then the model's and the environment's segments of the response in order
(loss_mask 1 = sampled by the model, 0 = appended by the environment), each with its
token count, the model's mean rollout log-prob, and the episode's record.

Usage: transcript.py RUN STEP SAMPLE
  RUN     a run directory (rollouts.h5 and metrics.h5, whose deck names the tokenizer)
  STEP    the step whose samples to read
  SAMPLE  GROUP:INDEX (a group and its sample), or K (the step's K-th row of rollouts.h5)
Tokens decode with the run's vocabulary: slimpi's byte tokenizer, or a Hugging Face
tokenizer.json (byte-level BPE) found at the deck's tokenizer.path. Only h5py and numpy.
"""
import json
import os
import signal
import sys
import tomllib

import h5py
import numpy as np

STATUS = {0: "pending", 1: "completed", 2: "truncated", 3: "surplus", 5: "filtered", 6: "stale", 7: "baseline",
          8: "env_failed"}
ERRORS = {0: "none", 1: "model", 2: "tool", 3: "infra", 4: "overlong"}


def byte_level_decoder():
    """GPT-2's byte <-> printable-unicode table, inverted: unicode char -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def make_decoder(deck, run_dir):
    path = deck.get("tokenizer", {}).get("path", "bytes")
    if path in ("", "bytes"):
        names = {256: "<pad>", 257: "<bos>", 258: "<eos>"}
        return lambda ids: b"".join(bytes([t]) if t < 256 else names.get(t, f"<{t}>").encode() for t in ids).decode(
            "utf-8", "replace")
    for cand in (path, os.path.join(path, "tokenizer.json"), os.path.join(run_dir, path, "tokenizer.json")):
        if os.path.isfile(cand):
            tok = json.load(open(cand))
            break
    else:
        raise SystemExit(f"transcript.py: the run's tokenizer.path {path!r} has no tokenizer.json")
    vocab = {i: s for s, i in tok["model"]["vocab"].items()}
    special = {t["id"]: t["content"] for t in tok.get("added_tokens", [])}
    table = byte_level_decoder()

    def decode(ids):
        out = bytearray()
        for t in ids:
            t = int(t)
            if t in special:
                out += special[t].encode()
            elif t in vocab:
                out += bytes(table.get(c, ord("?")) for c in vocab[t])
            else:
                out += f"<{t}>".encode()
        return out.decode("utf-8", "replace")
    return decode


def row(f, name, i):
    d = f["samples/" + name]
    if isinstance(d, h5py.Group):
        off = d["offsets"]
        return d["values"][off[i]:off[i + 1]]
    return d[i]


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    run, step, which = sys.argv[1].rstrip("/"), int(sys.argv[2]), sys.argv[3]
    with h5py.File(os.path.join(run, "metrics.h5"), "r") as m:
        deck_text = m.attrs.get("deck", b"")
    deck = tomllib.loads(deck_text.decode() if isinstance(deck_text, bytes) else str(deck_text))
    decode = make_decoder(deck, run)
    with h5py.File(os.path.join(run, "rollouts.h5"), "r") as f:
        rows = np.nonzero(f["samples/step"][:] == step)[0]
        if len(rows) == 0:
            raise SystemExit(f"transcript.py: {run}/rollouts.h5 has no samples of step {step}")
        if ":" in which:
            g, k = (int(x) for x in which.split(":"))
            hits = [i for i in rows if f["samples/group_index"][i] == g and f["samples/index"][i] == k]
            if not hits:
                raise SystemExit(f"transcript.py: step {step} has no sample {g}:{k}")
            i = hits[0]
        else:
            k = int(which)
            if not 0 <= k < len(rows):
                raise SystemExit(f"transcript.py: step {step} has {len(rows)} samples; {k} is not one")
            i = rows[k]
        tokens = row(f, "tokens", i)
        p = int(f["samples/prompt_length"][i])
        mask = row(f, "loss_mask", i) if "loss_mask" in f["samples"] else np.array([])
        logp = row(f, "rollout_log_probs", i)
        response = tokens[p:]
        if len(mask) != len(response):
            mask = np.ones(len(response))
        has_env = "env_turns" in f["samples"]
        contexts = set(int(c) for c in row(f, "context_starts", i)) if "context_starts" in f["samples"] else set()
        head = (f"{run}: step {step}, group {f['samples/group_index'][i]}, sample {f['samples/index'][i]}: "
                f"status {STATUS.get(int(f['samples/status'][i]), f['samples/status'][i])}, "
                f"raw reward {f['samples/raw_reward'][i]:g}")
        if has_env:
            head += (f", {f['samples/env_turns'][i]} turns, {f['samples/env_tool_calls'][i]} tool calls, "
                     f"error {ERRORS.get(int(f['samples/env_error'][i]), '?')}, "
                     f"{f['samples/env_time_s'][i]:.3f} s waiting for the environment of "
                     f"{f['samples/episode_time_s'][i]:.3f} s")
    print(head)
    print(f"--- prompt ({p} tokens)")
    print(decode(tokens[:p]))
    start = 0
    while start < len(response):
        end = start
        while end < len(response) and (mask[end] > 0) == (mask[start] > 0) and (end == start or end not in contexts):
            end += 1
        seg = response[start:end]
        if mask[start] > 0:
            lp = logp[start:end] if len(logp) == len(response) else []
            extra = f", mean log-prob {np.mean(lp):.3f}" if len(lp) else ""
            print(f"--- model ({len(seg)} tokens{extra})")
        elif start in contexts:
            print(f"--- environment: a new context ({len(seg)} tokens; the model sees only this and what follows)")
        else:
            print(f"--- environment ({len(seg)} tokens)")
        print(decode(seg))
        start = end


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `transcript.py ... | head` ends quietly
    main()
