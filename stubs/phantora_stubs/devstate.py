"""The current device and current stream of each thread, and the ids of streams and events.

With the fake CUDA library loaded (CPU-only torch) the truth lives in the library, so that C++ code (device guards,
the autograd engine's stream guards) and Python (`torch.cuda.set_device`, `torch.cuda.stream`) agree. On a CUDA build
of torch the library is not loaded and the state is kept here, per thread, without touching the real device.

Stream id 0 is the default stream of each device; other streams get process-unique ids. The op stream of a rank
uses these ids as `Op.stream` (a rank normally drives a single device).
"""

from __future__ import annotations

import itertools
import threading


class DeviceState:
    def __init__(self, lib, device_count: int):
        self._lib = lib if lib is not None and lib.phantora_guard_installed() else None
        self.device_count = device_count
        self._local = threading.local()
        self._stream_ids = itertools.count(1_000_000)   # used only without the library
        self._event_ids = itertools.count(1)
        self.default_device = 0

    # -- device ---------------------------------------------------------------------------------------------------
    def device(self) -> int:
        if self._lib is not None:
            return int(self._lib.phantora_get_device())
        return getattr(self._local, "device", self.default_device)

    def set_device(self, index: int) -> None:
        if self._lib is not None:
            self._lib.phantora_set_device(int(index))
        else:
            self._local.device = int(index)

    # -- streams ---------------------------------------------------------------------------------------------------
    def stream(self, device: int | None = None) -> int:
        d = self.device() if device is None or device < 0 else device
        if self._lib is not None:
            return int(self._lib.phantora_get_stream(d))
        streams = getattr(self._local, "streams", None)
        return 0 if streams is None else streams.get(d, 0)

    def set_stream(self, device: int, stream_id: int) -> None:
        if self._lib is not None:
            self._lib.phantora_set_stream(int(device), int(stream_id))
            return
        streams = getattr(self._local, "streams", None)
        if streams is None:
            streams = self._local.streams = {}
        streams[int(device)] = int(stream_id)

    def new_stream_id(self) -> int:
        if self._lib is not None:
            return int(self._lib.phantora_new_stream_id())
        return next(self._stream_ids)

    def new_event_id(self) -> int:
        return next(self._event_ids)
