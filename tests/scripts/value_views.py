"""Known values as a GPU computes them (2 ranks): a collective into a view of a tensor, an in-place gather, a gather
into a list of views of one buffer; a view overwritten with data of unknown value; formatting a 0-d tensor; isfinite
of a value not known; printing tensors; bf16 all-reduce, reduce, reduce-scatter; a boolean or with a known all-True operand;
the root's own chunk of a scatter and a gather. Prints
one RESULT line per rank."""

import json
import os

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
r, w = dist.get_rank(), dist.get_world_size()
src = torch.tensor([0.5 + r, 7.0], device="cuda")

into_view = torch.zeros(w, 2, device="cuda")
dist.all_gather_into_tensor(into_view.view(-1), src)

in_place = torch.zeros(w, 2, device="cuda")
in_place[r] = src
dist.all_gather_into_tensor(in_place.view(-1), in_place[r].view(-1))

buffer = torch.zeros(w * 2, device="cuda")
dist.all_gather(list(buffer.view(w, 2).unbind(0)), src)

big = torch.randn(1 << 16, device="cuda")              # model-sized data: its value is not known
overwritten = torch.full((4,), 3.0, device="cuda")
overwritten[:2].copy_(big[:2])

loss = (big * big).mean()

bf16 = torch.ones(4, dtype=torch.bfloat16, device="cuda")
dist.all_reduce(bf16)
reduced = torch.full((4,), 1.0 + r, device="cuda")
dist.reduce(reduced, dst=0)
scattered = torch.full((4,), 7.0, device="cuda")
dist.reduce_scatter_tensor(scattered, torch.arange(8, dtype=torch.float32, device="cuda"))

# stopping criteria as Hugging Face's generate() combines them: a known max-length flag or an unknown EOS test
max_length_done = torch.full((2,), True, device="cuda")
eos = torch.isin(big[:2].long(), torch.tensor([2], device="cuda"))
unfinished = torch.ones(2, dtype=torch.long, device="cuda") & ~(max_length_done | eos)
still_unknown = torch.full((2,), False, device="cuda") | eos
weight = torch.ones(2, device="cuda", requires_grad=True)
scatter_out = torch.full((2,), -1.0, device="cuda")    # the root's own chunk lands in its output
dist.scatter(scatter_out, [torch.full((2,), 10.0 * i + 5, device="cuda") for i in range(w)] if r == 0 else None, src=0)
gather_out = [torch.full((2,), -1.0, device="cuda") for _ in range(w)] if r == 0 else None
dist.gather(src, gather_out, dst=0)
grad = torch.randn(1 << 20, device="cuda")          # too large for the value table: isfinite's result is all True
finite = torch.isfinite(grad)
views_all = [bool(finite.view(1024, 1024).all()), bool(finite.reshape(-1, 64).all()),
             bool(finite.view(1, -1).expand(2, -1).all()), bool(finite.detach().all())]
written = torch.isfinite(grad)
written.view(1024, 1024)[3].zero_()          # a write through a view: the base no longer holds one value
out = {"rank": r, "grad_finite_all": bool(finite.all()), "grad_nonfinite_any": bool((~finite).any()),
       "grad_views_all": views_all, "grad_written_all": bool(written.all()),
       "grad_finite_rows": bool(torch.isfinite(grad.view(1024, 1024)).all(dim=1).all()),
       "grad_nan_any": bool(torch.isnan(grad).any()), "into_view": into_view.tolist(), "in_place": in_place.tolist(), "list_views": buffer.tolist(),
       "overwritten": overwritten.tolist(), "fmt_known": f"{torch.tensor(1.5, device='cuda'):.3f}",
       "fmt_unknown": f"{loss:.2f}", "isfinite": bool(torch.isfinite(loss)), "isfinite_method": loss.isfinite().item(),
       "isnan": bool(torch.isnan(loss)), "bf16_all_reduce": bf16.tolist(), "reduced": reduced.tolist(),
       "reduce_scattered": scattered.tolist(), "stop": bool(unfinished.max() == 0),
       "unknown_or": still_unknown.tolist(), "repr_known": repr(torch.tensor([1.5, 2.5], device="cuda")),
       "repr_grad": str(weight * 2), "repr_leaf": repr(weight), "print_loss": f"{loss}",
       "repr_bf16": repr(torch.ones((), dtype=torch.bfloat16, device="cuda")),
       "scatter_root": scatter_out.tolist() if r == 0 else None,
       "gather_root_own": gather_out[0].tolist() if r == 0 else None}
print("RESULT " + json.dumps(out), flush=True)
dist.destroy_process_group()
