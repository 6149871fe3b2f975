"""One .safetensors file as the regression scripts' checks read it (no torch): its JSON
header, its data section, and a tensor of it as a little-endian float32 numpy array (the
scripts read fp32 exports). Imported by the scripts' inline checks, which run from the
repository root: PYTHONPATH=tests/regression."""
import json
import struct

import numpy as np


class SafetensorsFile:
    def __init__(self, path):
        raw = open(path, "rb").read()
        self.header_bytes = struct.unpack("<Q", raw[:8])[0]  # the header's length, as the file's first 8 bytes say
        self.header = json.loads(raw[8:8 + self.header_bytes])
        self.data = raw[8 + self.header_bytes:]  # the tensors' bytes (the header holds their offsets)

    def tensor(self, name):
        b, e = self.header[name]["data_offsets"]
        return np.frombuffer(self.data[b:e], dtype="<f4").reshape(self.header[name]["shape"])
