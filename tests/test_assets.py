"""The locally generated TorchTitan assets: the tokenizer's vocabulary has the model preset's size (the published
vocabulary sizes are cited below, independent of the preset files), its special tokens are where its config says,
and every dataset line is a JSON object whose text the tokenizer covers without unknown tokens.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from phantora.errors import PhantoraError
from phantora.frameworks.commands import assets_cmd
from phantora.frameworks.torchtitan.assets import (DATASET_DIR, DATASET_FILE, TOKENIZER_DIR, vocabulary,
                                                   write_torchtitan_assets)

# Published vocabulary sizes: Llama 3 (Meta, "The Llama 3 Herd of Models", arXiv:2407.21783, §3.1: 128K tokens;
# config.json vocab_size 128256) and Llama 2 (arXiv:2307.09288 §2.1: 32k tokens; config.json vocab_size 32000).
PUBLISHED_VOCAB = {"llama3-8b": 128256, "llama2-7b": 32000}


def _vocab_size_of(tokenizer_dir) -> int:
    """The vocabulary size as the `tokenizers` library reports it, or counted from the JSON without it."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        data = json.loads((tokenizer_dir / "tokenizer.json").read_text())
        ids = set(data["model"]["vocab"].values()) | {t["id"] for t in data["added_tokens"]}
        assert ids == set(range(len(ids))), "token ids are not 0..n-1"
        return len(ids)
    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()


@pytest.mark.parametrize("model", sorted(PUBLISHED_VOCAB))
def test_vocab_size_is_the_models(tmp_path, model):
    paths = write_torchtitan_assets(tmp_path, model=model, documents=3, words_per_document=50)
    assert _vocab_size_of(paths.tokenizer_dir) == PUBLISHED_VOCAB[model]


def test_special_tokens_and_dataset_lines(tmp_path):
    paths = write_torchtitan_assets(tmp_path, vocab_size=1000, documents=7, words_per_document=30, seed=3)
    config = json.loads((paths.tokenizer_dir / "tokenizer_config.json").read_text())
    vocab = json.loads((paths.tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"]
    assert config["bos_token"] in vocab and config["eos_token"] in vocab
    assert config["bos_token"] != config["eos_token"]
    lines = (paths.dataset_dir / DATASET_FILE).read_text().splitlines()
    assert len(lines) == 7
    for line in lines:
        words = json.loads(line)["text"].split()
        assert len(words) == 30
        assert all(w in vocab for w in words)
        assert config["bos_token"] not in words and config["eos_token"] not in words


def test_tokenizer_encodes_without_unknowns(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    paths = write_torchtitan_assets(tmp_path, vocab_size=500, documents=2, words_per_document=40)
    tok = tokenizers.Tokenizer.from_file(str(paths.tokenizer_dir / "tokenizer.json"))
    unk = tok.token_to_id("<unk>")
    text = json.loads((paths.dataset_dir / DATASET_FILE).read_text().splitlines()[0])["text"]
    ids = tok.encode(text).ids
    assert len(ids) == 40 and unk not in ids and max(ids) < 500


def test_vocabulary_ids_are_dense_and_distinct():
    v = vocabulary(5000)
    assert sorted(v.values()) == list(range(5000))
    assert len(set(v)) == 5000


def test_bad_requests_are_refused(tmp_path):
    with pytest.raises(PhantoraError):
        write_torchtitan_assets(tmp_path, vocab_size=2)
    with pytest.raises(PhantoraError):
        write_torchtitan_assets(tmp_path, model="llama3-8b", vocab_size=10)
    with pytest.raises(PhantoraError):
        write_torchtitan_assets(tmp_path, model="no-such-model")


def test_command_writes_the_flags_it_prints(tmp_path):
    out = tmp_path / "a"
    res = CliRunner().invoke(assets_cmd, ["torchtitan", "--model", "llama2-7b", "--out", str(out),
                                          "--documents", "2", "--words", "10"])
    assert res.exit_code == 0, res.output
    assert str(out / TOKENIZER_DIR) in res.output and str(out / DATASET_DIR) in res.output
    assert (out / DATASET_DIR / DATASET_FILE).exists()
    assert _vocab_size_of(out / TOKENIZER_DIR) == PUBLISHED_VOCAB["llama2-7b"]
    bad = CliRunner().invoke(assets_cmd, ["torchtitan", "--model", "nope", "--out", str(tmp_path / "b")])
    assert bad.exit_code != 0 and "nope" in bad.output


def test_an_output_folder_that_cannot_be_made_is_an_error_naming_out():
    # /proc takes no new folders on Linux, whoever runs the test (root included)
    r = CliRunner().invoke(assets_cmd, ["torchtitan", "--model", "llama3-8b", "--out", "/proc/as", "--documents", "1",
                                        "--words", "1"])
    assert r.exit_code == 1 and "--out /proc/as" in r.output, r.output
    assert isinstance(r.exception, SystemExit) and "Traceback" not in r.output
