"""The weight syncs of a run, from its metrics.h5 (perf/delta_sync.sh, perf/delta_sync_qwen3.sh).

sync_stats(RUN_DIR) -> (bytes, seconds, density, density_min, density_max, first_bytes, n):
medians over the syncs after the first (the first is an anchor), the density range over
them, the first sync's bytes and the number of syncs.
"""
import h5py
import numpy as np


def sync_stats(run_dir):
    with h5py.File(f"{run_dir}/metrics.h5") as f:
        s = f["steps"]
        n = int(np.isfinite(s["perf/weight_sync_bytes"][:]).sum())
        b, gbps = s["perf/weight_sync_bytes"][:n], s["perf/weight_sync_gbps"][:n]
        d = s["perf/weight_sync_density"][:n] if "weight_sync_density" in s["perf"] else np.ones(n)
    t = b / (gbps * 1e9)
    return np.median(b[1:]), np.median(t[1:]), np.median(d[1:]), d[1:].min(), d[1:].max(), b[0], n
