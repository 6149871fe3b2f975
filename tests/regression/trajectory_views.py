"""Views of a rollouts.h5 trajectory for the regression checks (agent_runs.sh): its text
under data.chat_template = none over the byte tokenizer, and its runs of equal loss mask."""


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
