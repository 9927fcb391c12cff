"""`phantora groundtruth submit/new/list`: schema, units, plausibility, duplicates, contradictions, filing.

Physics used as the reference: a run cannot exceed the GPU's dense peak, so tokens/s per GPU is at most
peak FLOP/s / training FLOPs per token (6 × non-embedding parameters + 12 · layers · dim · seq, computed here from the
model's shape); H100 SXM dense BF16 peak 989.4 TFLOP/s (NVIDIA H100 whitepaper) and 79.18 GiB usable memory (the
h100-sxm-80gb preset's driver figure).
"""

import tomllib

import pytest
from click.testing import CliRunner

from phantora.errors import PhantoraError
from phantora.groundtruth import store
from phantora.groundtruth.commands import groundtruth
from phantora.groundtruth.schema import RECORD_FRAMEWORKS, load_record
from phantora.groundtruth.submit import submit
from phantora.groundtruth.template import template
from phantora.groundtruth.tomlwrite import dumps
from phantora.models import load_model

H100_BF16 = 989.4e12
GIB = 2**30

BASE = """
id = "{id}"
suite = "local"
[source]
date = 2025-03-01
contributor = "{who}"
[hardware]
gpu = "h100-sxm-80gb"
gpus = {gpus}
hosts = {hosts}
gpus_per_host = 8
cluster = "h100-hgx"
intra_host_link = "nvswitch"
inter_host_gbps_per_gpu = {gbps}
[workload]
framework = "torchtitan"
framework_version = "0.3.0"
model = "llama3-8b"
micro_batch = 2
global_batch = {global_batch}
seq_len = 8192
activation_checkpointing = "selective-op"
[workload.parallelism]
dp_shard = {gpus}
[metrics]
{metrics}
"""


def text(id="run-a", who="alice", gpus=8, hosts=1, metrics="tokens_per_s_per_gpu = 6000.0", global_batch=None,
         gbps=0.0):
    return BASE.format(id=id, who=who, gpus=gpus, hosts=hosts, metrics=metrics, gbps=gbps,
                       global_batch=global_batch if global_batch is not None else 2 * gpus)


def llama3_8b_flops_per_token(seq: int) -> float:
    m = load_model("llama3-8b")
    hd = m.dim // m.n_heads
    per_layer = 2 * m.dim * m.dim + 2 * m.dim * m.n_kv_heads * hd + 3 * m.dim * m.ffn_dim + 2 * m.dim
    non_embedding = m.n_layers * per_layer + m.dim + m.vocab_size * m.dim     # output projection counts
    return 6 * non_embedding + 12 * m.n_layers * m.dim * seq


@pytest.fixture
def root(tmp_path, monkeypatch):
    gt = tmp_path / "groundtruth"
    gt.mkdir()
    monkeypatch.setattr(store, "groundtruth_dir", lambda: gt)
    monkeypatch.delenv("PHANTORA_HOME", raising=False)
    monkeypatch.chdir(tmp_path)          # outside any checkout: the CLI files into groundtruth_dir()
    return gt


def files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def write(tmp_path, name, body):
    p = tmp_path / name
    p.write_text(body)
    return p


def refused(path, root, match, **kw):
    before = files(root)
    with pytest.raises(PhantoraError, match=match) as exc:
        submit(path, **kw)
    assert files(root) == before, "a refused submission must write nothing"
    return str(exc.value)


def test_valid_record_is_filed_normalized_and_reads_back(tmp_path, root):
    p = write(tmp_path, "a.toml", text())
    res = submit(p)
    assert res.written and res.target == root / "local" / "run-a.toml"
    back = load_record(res.target)
    assert back == res.record
    assert back.source.date == "2025-03-01"            # a TOML date becomes an ISO string
    assert back.metrics.tokens_per_s_per_gpu == 6000.0
    # canonical key order: the schema's, whatever the submission's order was
    keys = list(tomllib.loads(res.target.read_text()))
    assert keys[:2] == ["id", "suite"]


def test_dry_run_writes_nothing(tmp_path, root):
    res = submit(write(tmp_path, "a.toml", text()), dry_run=True)
    assert not res.written and files(root) == []
    assert tomllib.loads(res.text)["id"] == "run-a"


def test_schema_errors_name_file_and_key(tmp_path, root):
    p = write(tmp_path, "bad.toml", text().replace("gpus_per_host = 8\n", ""))
    msg = refused(p, root, "hardware.gpus_per_host")
    assert str(p) in msg
    p = write(tmp_path, "typo.toml", text().replace("seq_len", "seqlen"))
    msg = refused(p, root, "workload.seqlen")
    assert str(p) in msg


def test_gpu_count_must_be_hosts_times_gpus_per_host(tmp_path, root):
    p = write(tmp_path, "a.toml", text(gpus=16, hosts=1))
    refused(p, root, "hardware.gpus")


def test_mfu_above_100_percent_and_fraction_in_percent_key(tmp_path, root):
    refused(write(tmp_path, "a.toml", text(metrics="mfu_percent = 120.0")), root, "exceeds 100%")
    refused(write(tmp_path, "b.toml", text(metrics="mfu_percent = 0.4")), root, "looks like a fraction")


def test_throughput_above_the_gpu_peak_is_refused(tmp_path, root):
    limit = H100_BF16 / llama3_8b_flops_per_token(8192)
    msg = refused(write(tmp_path, "a.toml", text(metrics=f"tokens_per_s_per_gpu = {1.05 * limit:.1f}")), root,
                  "dense peak")
    assert "metrics.tokens_per_s_per_gpu" in msg
    res = submit(write(tmp_path, "b.toml", text(id="run-b", metrics=f"tokens_per_s_per_gpu = {0.95 * limit:.1f}")),
                 dry_run=True)
    assert res.record.metrics.tokens_per_s_per_gpu == pytest.approx(0.95 * limit, abs=0.1)


def test_mfu_must_agree_with_throughput(tmp_path, root):
    tps = 6000.0
    mfu = 100 * tps * llama3_8b_flops_per_token(8192) / H100_BF16
    ok = submit(write(tmp_path, "a.toml", text(metrics=f"tokens_per_s_per_gpu = {tps}\nmfu_percent = {mfu:.2f}")),
                dry_run=True)
    assert ok.record.metrics.mfu_percent == pytest.approx(mfu, abs=0.01)
    refused(write(tmp_path, "b.toml", text(metrics=f"tokens_per_s_per_gpu = {tps}\nmfu_percent = {1.3 * mfu:.2f}")),
            root, "disagrees with the throughput")


def test_memory_above_vram_is_refused(tmp_path, root):
    refused(write(tmp_path, "a.toml", text(metrics="memory_gib = 85.0")), root, "metrics.memory_gib")
    assert submit(write(tmp_path, "b.toml", text(metrics="memory_gib = 78.0")), dry_run=True).record


def test_oom_record_carries_no_other_metric(tmp_path, root):
    refused(write(tmp_path, "a.toml", text(metrics="oom = true\ntokens_per_s_per_gpu = 10.0")), root,
            "no other metric")
    assert submit(write(tmp_path, "b.toml", text(metrics="oom = true")), dry_run=True).record.metrics.oom


def test_unit_aliases_are_converted(tmp_path, root):
    res = submit(write(tmp_path, "a.toml", text(metrics="memory_gb = 80.0\niteration_ms = 2500.0")))
    m = load_record(res.target).metrics
    assert m.memory_gib == pytest.approx(80e9 / GIB)
    assert m.iteration_s == pytest.approx(2.5)
    res = submit(write(tmp_path, "b.toml", text(id="run-b", who="bob", gpus=16, hosts=2, gbps=400.0,
                                                metrics="tokens_per_s = 96000.0")))
    assert load_record(res.target).metrics.tokens_per_s_per_gpu == pytest.approx(96000.0 / 16)
    refused(write(tmp_path, "c.toml", text(id="run-c", metrics="memory_gb = 70.0\nmemory_gib = 65.0")), root,
            "same quantity")


def test_iteration_time_must_agree_with_throughput(tmp_path, root):
    tps = 6000.0
    it = 16 * 8192 / (tps * 8)                # global batch × seq / (tokens/s/GPU × GPUs)
    assert submit(write(tmp_path, "a.toml", text(metrics=f"tokens_per_s_per_gpu = {tps}\niteration_s = {it}")),
                  dry_run=True)
    refused(write(tmp_path, "b.toml", text(metrics=f"tokens_per_s_per_gpu = {tps}\niteration_s = {1.2 * it}")),
            root, "metrics.iteration_s")


def test_duplicate_is_refused(tmp_path, root):
    submit(write(tmp_path, "a.toml", text()))
    refused(write(tmp_path, "b.toml", text(id="run-a-again")), root, "duplicate of")
    refused(write(tmp_path, "c.toml", text(who="bob", metrics="tokens_per_s_per_gpu = 6100.0")), root, "is taken")


def test_contradiction_is_refused_with_both_values_unless_forced(tmp_path, root):
    submit(write(tmp_path, "a.toml", text(metrics="tokens_per_s_per_gpu = 6000.0")))
    far = write(tmp_path, "b.toml", text(id="run-b", who="bob", metrics="tokens_per_s_per_gpu = 6700.0"))
    msg = refused(far, root, "contradicts")
    assert "6700" in msg and "6000" in msg
    res = submit(far, force=True)
    assert res.written and res.forced
    near = write(tmp_path, "c.toml", text(id="run-c", who="carol", metrics="tokens_per_s_per_gpu = 6500.0"))
    assert submit(near).written                 # 8.3% from 6000: within 10%
    oom = write(tmp_path, "d.toml", text(id="run-d", who="dave", metrics="oom = true"))
    refused(oom, root, "OOM")


def test_template_becomes_a_valid_record_once_its_source_is_filled(tmp_path, root):
    out = CliRunner().invoke(groundtruth, ["new", "--suite", "mysuite"])
    assert out.exit_code == 0
    assert tomllib.loads(out.output)["suite"] == "mysuite"
    blank = write(tmp_path, "t.toml", out.output)
    refused(blank, root, "source.contributor")
    filled = write(tmp_path, "f.toml", out.output.replace('contributor = ""', 'contributor = "tester"'))
    res = submit(filled, dry_run=True)
    assert res.record.suite == "mysuite"


def test_unknown_framework_is_refused_naming_the_key_and_the_known_ones(tmp_path, root):
    msg = refused(write(tmp_path, "a.toml", text().replace('framework = "torchtitan"', 'framework = "titan"')),
                  root, "workload.framework")
    assert "'titan'" in msg and all(name in msg for name in RECORD_FRAMEWORKS)
    r = CliRunner().invoke(groundtruth, ["submit", str(tmp_path / "a.toml")])
    assert r.exit_code == 1 and "workload.framework" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("string", ["a b", 'say "hi"', "back\\slash", "del\x7f", "tab\there", "two\nlines",
                                    "ends\n", "crlf\r\nline", "ctl\x01\nline", 'q"""\nq', "é 中"])
def test_written_toml_reads_back_whatever_the_strings_hold(string):
    table = {"k": string, string: 1, "t": {string: [string, string]}}
    assert tomllib.loads(dumps(table)) == table


def test_template_is_toml_for_every_framework_and_refuses_bad_names():
    for framework in RECORD_FRAMEWORKS:
        out = CliRunner().invoke(groundtruth, ["new", "--framework", framework])
        assert out.exit_code == 0, out.output
        assert tomllib.loads(out.output)["workload"]["framework"] == framework
    for args, option in ((["--suite", 'my "suite"'], "'--suite'"), (["--suite", "My Suite"], "'--suite'"),
                         (["--framework", "titan"], "'--framework'")):
        out = CliRunner().invoke(groundtruth, ["new", *args])
        assert out.exit_code == 2, out.output
        errors = [line for line in out.output.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and option in errors[0], out.output
    assert 'suite = "a\\"b"' in template('a"b') and tomllib.loads(template('a"b'))["suite"] == 'a"b'
    # without --framework: the framework of the suite's records (the reference workload's for `local`)
    for suite, framework in (("local", "phantora-llama"), ("deepspeed", "deepspeed")):
        out = CliRunner().invoke(groundtruth, ["new", "--suite", suite])
        assert tomllib.loads(out.output)["workload"]["framework"] == framework


def test_cli_submit_and_list(tmp_path, root):
    cli = CliRunner()
    bad = write(tmp_path, "bad.toml", text(metrics="mfu_percent = 120.0"))
    r = cli.invoke(groundtruth, ["submit", str(bad)])
    assert r.exit_code != 0 and "exceeds 100%" in r.output and files(root) == []
    good = write(tmp_path, "good.toml", text())
    r = cli.invoke(groundtruth, ["submit", str(good), "--dry-run"])
    assert r.exit_code == 0 and files(root) == []
    r = cli.invoke(groundtruth, ["submit", str(good)])
    assert r.exit_code == 0 and files(root) == ["local/run-a.toml"]
    r = cli.invoke(groundtruth, ["list", "--json"])
    listed = __import__("json").loads(r.output)
    assert [x["id"] for x in listed] == ["run-a"]
    r = cli.invoke(groundtruth, ["list"])
    assert r.exit_code == 0 and "run-a" in r.output and "6,000 tok/s/GPU" in r.output
    r = cli.invoke(groundtruth, ["list", "--suite", "nosuch"])
    assert r.exit_code != 0 and "no ground-truth suite 'nosuch'" in r.output


def test_simulate_attaches_the_estimate(tmp_path, root):
    from phantora_validation.runner import SimResult
    from phantora.groundtruth.submit import simulation_of

    seen = []

    def fake(record):
        seen.append(record.id)
        return simulation_of(record, SimResult(tokens_per_s_per_gpu=5900.0, memory_gib=70.5, cost_source="profile"))

    res = submit(write(tmp_path, "a.toml", text()), simulate=fake)
    back = load_record(res.target)
    assert seen == ["run-a"]
    assert back.simulation.tokens_per_s_per_gpu == 5900.0 and back.simulation.cost_source == "profile"
    assert back.metrics.tokens_per_s_per_gpu == 6000.0          # the measurement is untouched

    def failing(record):
        raise PhantoraError("no torchtitan")

    refused(write(tmp_path, "b.toml", text(id="run-b", who="bob")), root, "--simulate failed", simulate=failing)
