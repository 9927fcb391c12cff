"""A rank that starts a child with multiprocessing's spawn context (as Megatron-core's checkpoint writer starts a
Manager): the child imports this main module again, triton included, and answers through a queue."""
import json
import multiprocessing as mp

import torch
import triton  # noqa: F401  (a GPU machine has it; the child must find what its rank found)


def child(q):
    import triton as t
    q.put({"triton_stub": bool(getattr(t, "__phantora_stub__", False)), "cuda_tensor": torch.cuda.is_available()})


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    manager = ctx.Manager()
    q = manager.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    p.join()
    print(json.dumps({"exitcode": p.exitcode, "child": q.get(timeout=30)}), flush=True)
    manager.shutdown()
