"""torch.save's zip files written without torch, for the loaders' tests."""

from __future__ import annotations

import numpy as np


def write_torch_file(path, state_dict, *, pickle_bytes=None):
    """A file in torch.save's zip layout, written from its documented structure:
    ``archive/data.pkl`` (protocol 2; storages as persistent ids ``("storage",
    torch.FloatStorage, key, "cpu", numel)``; tensors rebuilt by
    ``torch._utils._rebuild_tensor_v2``), ``archive/data/<key>`` (raw little-endian
    bytes), ``archive/version``. torch's globals are pickled by name from stand-in
    modules that exist only while writing."""
    import collections
    import io
    import pickle
    import sys
    import types
    import zipfile

    torch, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")

    class FloatStorage:
        pass

    class _Tensor:
        def __init__(self, key, array):
            self.key, self.array = key, array

        def __reduce__(self):
            return (utils._rebuild_tensor_v2, (_Storage(self.key, self.array), 0, self.array.shape,
                                               tuple(s // self.array.itemsize for s in self.array.strides),
                                               False, collections.OrderedDict()))

    class _Storage:
        def __init__(self, key, array):
            self.key, self.array = key, array

    def _rebuild_tensor_v2(*args):
        raise AssertionError("never called while writing")

    FloatStorage.__module__, FloatStorage.__qualname__ = "torch", "FloatStorage"
    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    torch.FloatStorage, utils._rebuild_tensor_v2, torch._utils = FloatStorage, _rebuild_tensor_v2, utils

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, _Storage):
                return ("storage", FloatStorage, obj.key, "cpu", obj.array.size)
            return None

    tensors = collections.OrderedDict(
        (name, _Tensor(str(i), np.ascontiguousarray(a, np.float32))) for i, (name, a) in enumerate(state_dict.items()))
    saved = {k: sys.modules.get(k) for k in ("torch", "torch._utils")}
    sys.modules.update({"torch": torch, "torch._utils": utils})
    try:
        buffer = io.BytesIO()
        Pickler(buffer, protocol=2).dump(tensors)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle_bytes if pickle_bytes is not None else buffer.getvalue())
        z.writestr("archive/version", "3\n")
        for t in tensors.values():
            z.writestr(f"archive/data/{t.key}", t.array.tobytes())
