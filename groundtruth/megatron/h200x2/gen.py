import json, re, pathlib
root = pathlib.Path('/work/main/groundtruth/local')
COMMIT = '6bfba64'
AC = {'none': ('none', 0), 'full': ('full', 0), 'selective': ('selective-layer', 2)}
def rec(folder, name, gpu, n, cluster, contributor, where, oom_args=None):
    jf = root / folder / f'{name}.json'
    if jf.exists():
        d = json.load(open(jf)); c = d['config']
        model, batch, seq, ac = d['model'], c['batch'], c['seq'], c['ac']
        tp = c['tp']; dp = c['dp']; mode = c['dp_mode']
        oom = False
    else:
        model, batch, seq, ac, tp, dp, mode = oom_args; oom = True
    acn, period = AC[ac]
    dp_shard = dp if (mode == 'fsdp' and dp > 1) else 1
    dp_rep = dp if mode == 'ddp' and dp > 1 else 1
    rid = f"{gpu.split('-')[0]}-{n}-{name}"
    if oom:
        log = (root / folder / f'{name}.log').read_text()
        m1 = re.search(r'step 1 .* mem_gib ([0-9.]+)', log)
        m2 = re.search(r'torch.OutOfMemoryError: (CUDA out of memory\. Tried to allocate [0-9.]+ GiB\. GPU 0 has a total capacity of [0-9.]+ GiB of which [0-9.]+ GiB is free)', log)
        notes = (f"Reference workload presets/workloads/llama.py on {where}, 8 steps asked: it ran out of GPU memory. "
                 f"Step 1 completed (peak memory, torch.cuda.max_memory_allocated, {m1.group(1)} GiB); step 2 raised "
                 f"torch.OutOfMemoryError ('{m2.group(1)}') and the run exited with status 1, writing no SUMMARY. "
                 f"The pair of llama3.2-3b-g1-s8192-b1-ac-none (fits) marks the out-of-memory edge on one H100 80GB. "
                 f"Raw output: groundtruth/local/{folder}/{name}.log; command: groundtruth/local/measure2.sh.")
        section = f"groundtruth/local/{folder}/{name}.log"
    else:
        notes = (f"Reference workload presets/workloads/llama.py on {where}, 8 steps, median of steps 2-8 (the workload's "
                 f"SUMMARY). Peak memory (torch.cuda.max_memory_allocated) was {d['peak_mem_gib']:.2f} GiB; it is not "
                 f"recorded as a metric because the simulation reports reserved memory. Raw output: "
                 f"groundtruth/local/{folder}/{name}.log and .json; command: groundtruth/local/measure2.sh.")
        section = f"groundtruth/local/{folder}/{name}.json"
    L = ['# Ground-truth record (docs/groundtruth.md), filed by `phantora groundtruth submit`.',
         f'id = "{rid}"', 'suite = "local"', f'notes = {json.dumps(notes)}', '', '[source]',
         'date = "2026-11-26"', f'contributor = "{contributor}"',
         f'version = "presets/workloads/llama.py at {COMMIT}"', f'section = "{section}"', '', '[hardware]',
         f'gpu = "{gpu}"', f'gpus = {n}', 'hosts = 1', f'gpus_per_host = {n}', f'cluster = "{cluster}"',
         'intra_host_link = "nvswitch"', 'inter_host_gbps_per_gpu = 0.0', 'inter_host_link = "none (one host)"', '',
         '[workload]', 'framework = "phantora-llama"', f'framework_version = "{COMMIT}"', f'model = "{model}"',
         f'micro_batch = {batch}', f'global_batch = {batch * dp}', f'seq_len = {seq}',
         f'activation_checkpointing = "{acn}"', f'ac_layer_period = {period}', 'precision = "bf16"',
         'compile = false', 'float8 = false', 'torch_version = "2.11.0+cu130"', 'optimizer = "AdamW"', '',
         '[workload.parallelism]', f'dp_shard = {dp_shard}', f'dp_replicate = {dp_rep}', f'tp = {tp}', 'pp = 1',
         'cp = 1', 'ep = 1', '', '[metrics]']
    if oom:
        L += ['mfu_counts_embedding = false', 'oom = true', 'at_iteration = 0']
    else:
        L += [f"tokens_per_s_per_gpu = {round(d['tps_per_gpu'], 1)}", 'mfu_counts_embedding = false',
              f"iteration_s = {round(d['median_step_s'], 5)}", 'oom = false', 'at_iteration = 0']
    out = pathlib.Path('/tmp/gt') / f'{rid}.toml'
    out.write_text('\n'.join(L) + '\n')
    print(out)
g1 = ['llama3.2-1b-g1-s4096-b4-ac-none', 'llama3.2-1b-g1-s2048-b1-ac-none', 'llama3.2-3b-g1-s4096-b2-ac-full',
      'llama3.2-3b-g1-s8192-b1-ac-none', 'llama3.2-3b-g1-s8192-b2-ac-none']
for nm in g1:
    rec('h100x1', nm, 'h100-sxm-80gb', 1, 'h100-hgx', 'phantora maintainers (measured on one H100 SXM 80GB HBM3)',
        '1 x H100 80GB HBM3 (one GPU of one host)',
        oom_args=('llama3.2-3b', 2, 8192, 'none', 1, 1, 'fsdp'))
g2 = ['llama3.2-1b-fsdp2-s2048-b8-ac-none', 'llama3.2-1b-tp2-s4096-b2-ac-none', 'llama3.2-1b-ddp2-s2048-b4-ac-none',
      'llama3.2-3b-fsdp2-s4096-b2-ac-sel', 'llama3.2-3b-tp2-s8192-b1-ac-full', 'llama3-8b-fsdp2-s2048-b4-ac-full',
      'llama3-8b-tp2-s8192-b1-ac-full']
for nm in g2:
    rec('h200x2b', nm, 'h200-sxm-141gb', 2, 'h200-2gpu-nvlink', 'phantora maintainers (measured on 2 NVLinked H200 of one host)',
        '2 x H200 (one host, NVLink)')
