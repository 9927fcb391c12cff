"""DeepSpeed's async I/O handle (the stand-in) on its own: two 200 MiB writes from one I/O thread, then wait().
Prints, as one JSON line, what wait() returned and the virtual time it took (perf_counter around the three calls)."""
import json
import time

import torch
from phantora_stubs.standins.deepspeed import _async_io_module

handle = _async_io_module().aio_handle(intra_op_parallelism=1)
buf = torch.empty(50 << 20, dtype=torch.float32, device="cpu")      # 200 MiB
t0 = time.perf_counter()
assert handle.async_pwrite(buf, "unused-a.swp", 0) == 0
assert handle.async_pwrite(buf, "unused-b.swp", 0) == 0
done = handle.wait()
print("RESULT " + json.dumps({"done": done, "seconds": time.perf_counter() - t0,
                              "bytes": 2 * buf.numel() * buf.element_size()}), flush=True)
