"""Views of a rollouts.h5 trajectory for the regression checks (agent_runs.sh, pd_runs.sh):
its rows, its text under data.chat_template = none over the byte tokenizer, its runs of
equal loss mask, the sequences its turns sent to prefill engines, and the run's
train/rollout log-prob differences."""
import h5py


class Row:
    """One sample of rollouts.h5: row["status"] (a scalar field), row.col("tokens") (a ragged
    column: its values), row.episode ("step/group/index", as the agents' SLIMPI_EPISODE)."""

    def __init__(self, g, i):
        self.g, self.i = g, i
        self.episode = f"{g['step'][i]}/{g['group_index'][i]}/{g['index'][i]}"

    def __getitem__(self, key):
        return self.g[key][self.i]

    def col(self, key):
        o = self.g[key + "/offsets"]
        return self.g[key + "/values"][o[self.i]:o[self.i + 1]]


def rows(run):
    """Every sample of RUN/rollouts.h5, in file order."""
    with h5py.File(f"{run}/rollouts.h5") as f:
        g = f["samples"]
        for i in range(g["step"].shape[0]):
            yield Row(g, i)


def logprob_diffs(run):
    """train/train_rollout_logprob_abs_diff of every step of RUN/metrics.h5."""
    with h5py.File(f"{run}/metrics.h5") as f:
        return f["steps/train/train_rollout_logprob_abs_diff"][:]


def text(ids):
    """The bytes of token ids (ids < 256 are bytes; the special tokens above are dropped)."""
    return bytes(int(t) for t in ids if t < 256)


def runs(mask):
    """[(start, end, mask value)] of the runs of equal loss-mask values."""
    out, s = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[s]:
            out.append((s, i, mask[s]))
            s = i
    return out


def prefilled_sequences(row):
    """The token sequences an episode's turns sent to prefill engines (rollout.prefill_ranks):
    per context, its opening tokens up to its first model token (the first context's with
    the prompt). A resumed thread's turns are joined into the context they continue (after
    its first model token), and are not prefilled. For engines with a prefix cache (without
    one every turn is prefilled) and episodes not resumed from a checkpoint. A turn whose
    sequence was away already on its decode engine shares those rows instead of sending."""
    p, mask, toks = int(row["prompt_length"]), row.col("loss_mask"), row.col("tokens")

    def first_model_token(t):
        while t < len(mask) and mask[t] == 0:
            t += 1
        return t

    out = []
    for c in [-p] + [int(c) for c in row.col("context_starts")]:  # (the first context begins with the prompt)
        t = first_model_token(max(c, 0))
        if t < len(mask):  # (a context that ended before its first turn was never prefilled)
            out.append(tuple(int(x) for x in toks[p + c:p + t]))
    return out


def prefill_bounds(run):
    """(fewest, most) positions prefill engines can have sent for RUN's episodes: each
    distinct sequence of a step once, or every prefilled turn's (positions but the last)."""
    per_step, most = {}, 0
    for row in rows(run):
        for s in prefilled_sequences(row):
            most += len(s) - 1
            per_step.setdefault(int(row["step"]), set()).add(s)
    return sum(len(s) - 1 for seqs in per_step.values() for s in seqs), most
