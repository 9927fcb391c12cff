"""The commented record template that `phantora groundtruth new` prints.

The template is a complete record of an imaginary single-host run except for its source: filling in `source.url` or
`source.contributor` (and the real figures) makes it a valid submission. docs/groundtruth.md explains every key.
"""

from __future__ import annotations

from .tomlwrite import value

TEMPLATE = '''\
# Ground-truth record: one measured training run (every key: docs/groundtruth.md).
# Fill it in, then check and file it with:  phantora groundtruth submit FILE [--dry-run] [--simulate]
# Give only the metrics you measured; leave the others out. Units are in the key names.

id = {id}   # unique in the suite; lowercase, digits, '.', '_', '-'
suite = {suite}                                     # folder under groundtruth/
# notes = "anything else: dataset, optimizer settings, confidence interval over N runs"

[source]
date = "2025-01-01"          # YYYY-MM-DD: publication date, or the day you measured
url = ""                     # page that shows the figures (published results)
contributor = ""             # or: your name / GitHub handle (your own measurement)
# repository = "owner/name"  # for a document in a repository: where, which file, which commit, which table
# file = "docs/performance.md"
# commit = "0123abc"
# version = ""               # version of the document or setup where there is no commit
# section = "Table 1"

[hardware]
gpu = "h100-sxm-80gb"        # GPU preset (phantora presets)
gpus = 8                     # GPUs in the job = hosts × gpus_per_host
hosts = 1
gpus_per_host = 8
cluster = "h100-hgx"         # cluster preset that models these hosts (validation runs it with --nodes = hosts)
intra_host_link = "nvswitch" # nvswitch | nvlink-mesh | pcie
inter_host_gbps_per_gpu = 0.0   # scale-out Gb/s per GPU (0 for one host), e.g. 400.0
inter_host_link = ""         # in words, e.g. "InfiniBand NDR, one 400 Gb/s NIC per GPU"
# host_cpu_cores = 32        # CPU cores per host (nproc), where they differ from the cluster preset's [host]

[workload]
framework = {framework}
framework_version = "0.3.0"  # release or commit
torch_version = ""           # release or commit
model = "llama3-8b"          # model preset (phantora presets)
micro_batch = 2              # sequences per GPU per forward/backward (TorchTitan: local batch size)
global_batch = 16            # sequences per optimizer step = micro_batch × data-parallel degree × accumulation
seq_len = 8192               # tokens per sequence
activation_checkpointing = "selective-op"   # none | full | selective-op | selective-layer
# ac_layer_period = 2        # selective-layer only: every k-th block
precision = "bf16"           # bf16 | fp16 | tf32 | fp32 (matmul dtype under mixed precision)
compile = false              # torch.compile
float8 = false               # Float8 linears
optimizer = "AdamW"
# task = "other"             # not a language model (DeepSpeed: resnet50, sd15-unet, gat): seq_len = 1, samples
#                            # for sequences, and only iteration_s / memory_gib below

[workload.parallelism]       # product of dp_shard, dp_replicate, tp, pp, cp = gpus
dp_shard = 8                 # FSDP
dp_replicate = 1
tp = 1
pp = 1
cp = 1
ep = 1

[metrics]
tokens_per_s_per_gpu = 6000.0   # or tokens_per_s (whole job)
# mfu_percent = 40.0            # or mfu = 0.40 (fraction)
# mfu_counts_embedding = false  # true if your MFU counts 6 × all parameters (TorchTitan before 2024-04-26)
# iteration_s = 2.73            # or iteration_ms
# memory_gib = 70.0             # peak per GPU, GiB (2^30 B); or memory_gb (10^9 B), memory_mib, memory_bytes
# memory_allocated_gib = 61.2   # peak handed to tensors per GPU (torch.cuda.max_memory_allocated), GiB
# oom = true                    # the run did not fit (then no other metric)
# at_iteration = 100            # the iteration the figures were read at
# iteration_s_repeats = [2.81, 2.69]  # the same configuration measured again (other runs, hosts): seconds, always

# [assumptions]                 # values the source does not state, and why you chose them
# "hardware.inter_host_gbps_per_gpu" = "not stated; the cluster's NICs are 400 Gb/s"
'''


def template(suite: str = "local", framework: str = "torchtitan") -> str:
    """The commented template for a record of `suite` (the values written as TOML strings, whatever they hold)."""
    return TEMPLATE.format(id=value(f"{framework}-llama3-8b-8xh100-fsdp8-b2-s8192"), suite=value(suite),
                           framework=value(framework))
