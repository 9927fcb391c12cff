"""For tests/test_live_run.py: a script in the style of those the deepspeed launcher starts: `--local_rank` is a
required argument, and the launcher's variables are read."""
import argparse
import json
import os

p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int, required=True)
p.add_argument("--tag", default="")
args = p.parse_args()
print("RESULT " + json.dumps({"local_rank": args.local_rank, "tag": args.tag,
                              **{k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK",
                                                                "CROSS_SIZE", "WORLD_SIZE")}}), flush=True)
