"""Local stand-ins for the assets TorchTitan downloads from a hub: a tokenizer and a text dataset.

A simulation needs neither real text nor a real tokenizer: only the vocabulary size matters (it sets the shapes of
the embedding and output layers and the loss), and the dataset only has to yield token ids. `write_torchtitan_assets`
writes, without any network access:

- `tokenizer/tokenizer.json`: a Hugging Face `tokenizers` WordLevel tokenizer (whitespace pre-tokenizer) whose
  vocabulary has exactly the model preset's `vocab_size` entries: the special tokens (begin/end of text, unknown,
  padding) followed by generated words;
- `tokenizer/tokenizer_config.json`: names the begin/end-of-text tokens (`bos_token`, `eos_token`), as TorchTitan's
  `HuggingFaceTokenizer` reads them;
- `dataset/train.jsonl`: documents, one JSON object with a `text` field per line, made of the tokenizer's words
  (deterministic for a given seed), loadable by `datasets.load_dataset(DIR, split="train")`.

TorchTitan uses them as `--hf_assets_path OUT/tokenizer --dataloader.dataset c4_test --dataloader.dataset_path
OUT/dataset` (the `c4_test` dataset entry reads a local directory and takes each sample's `text` field).
`assets_torchtitan_cmd` is `phantora assets torchtitan` (the `assets` group is the framework registry's,
phantora/frameworks/commands.py).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import click

from ...errors import PhantoraError

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
UNK_TOKEN = "<unk>"
PAD_TOKEN = "<pad>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, PAD_TOKEN)

TOKENIZER_DIR = "tokenizer"
DATASET_DIR = "dataset"
DATASET_FILE = "train.jsonl"


@dataclass(frozen=True)
class AssetPaths:
    """Where `write_torchtitan_assets` put its files."""

    root: Path
    tokenizer_dir: Path          # --hf_assets_path
    dataset_dir: Path            # --dataloader.dataset_path
    vocab_size: int
    documents: int
    words_per_document: int


def word(i: int) -> str:
    """The i-th generated vocabulary word (`w` followed by i in base 36)."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    s = ""
    while True:
        i, r = divmod(i, 36)
        s = digits[r] + s
        if i == 0:
            return "w" + s


def vocabulary(vocab_size: int) -> dict[str, int]:
    """Token -> id: the special tokens first, then generated words, `vocab_size` entries in all."""
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise PhantoraError(f"vocabulary size {vocab_size} is too small (at least {len(SPECIAL_TOKENS) + 1})")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for j in range(vocab_size - len(SPECIAL_TOKENS)):
        vocab[word(j)] = len(SPECIAL_TOKENS) + j
    return vocab


def _added_token(content: str, token_id: int) -> dict:
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def tokenizer_json(vocab_size: int) -> dict:
    """The `tokenizers` serialisation of a WordLevel tokenizer with `vocab_size` tokens."""
    vocab = vocabulary(vocab_size)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added_token(t, vocab[t]) for t in SPECIAL_TOKENS],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": UNK_TOKEN},
    }


def tokenizer_config_json(vocab_size: int) -> dict:
    """The `tokenizer_config.json` beside it: begin/end-of-text tokens, no automatic BOS/EOS."""
    vocab = vocabulary(vocab_size)
    return {
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": UNK_TOKEN,
        "pad_token": PAD_TOKEN,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 1 << 30,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {str(vocab[t]): {"content": t, "lstrip": False, "normalized": False,
                                                 "rstrip": False, "single_word": False, "special": True}
                                 for t in SPECIAL_TOKENS},
    }


def write_tokenizer(out_dir: Path, vocab_size: int) -> Path:
    """Write tokenizer.json and tokenizer_config.json into `out_dir` (created if needed); returns `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.json").write_text(json.dumps(tokenizer_json(vocab_size)))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config_json(vocab_size), indent=1))
    return out_dir


def write_dataset(out_dir: Path, vocab_size: int, documents: int, words_per_document: int, seed: int = 0) -> Path:
    """Write `documents` lines of `{"text": ...}` made of generated words into `out_dir/train.jsonl`."""
    if documents <= 0 or words_per_document <= 0:
        raise PhantoraError(f"the dataset needs at least one document and one word per document "
                            f"(got {documents} documents of {words_per_document} words)")
    out_dir.mkdir(parents=True, exist_ok=True)
    n_words = vocab_size - len(SPECIAL_TOKENS)
    rng = random.Random(seed)
    path = out_dir / DATASET_FILE
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for _ in range(documents):
            text = " ".join(word(rng.randrange(n_words)) for _ in range(words_per_document))
            f.write(json.dumps({"text": text}) + "\n")
    tmp.replace(path)
    return out_dir


def model_vocab_size(model: str) -> int:
    """The vocabulary size of a model preset (name or TOML path)."""
    from ...models import load_model
    return load_model(model).vocab_size


def write_torchtitan_assets(out: str | Path, *, model: str | None = None, vocab_size: int | None = None,
                            documents: int = 256, words_per_document: int = 4096, seed: int = 0) -> AssetPaths:
    """Write a tokenizer (vocabulary of the model preset's size, or `vocab_size`) and a dataset under `out`.

    Tokens in the dataset: `documents × (words_per_document + 2)` (each document gains BOS and EOS); TorchTitan
    loops over the dataset, so a small one serves any number of steps.
    """
    if (model is None) == (vocab_size is None):
        raise PhantoraError("give exactly one of a model preset or a vocabulary size")
    size = model_vocab_size(model) if model is not None else int(vocab_size)   # type: ignore[arg-type]
    root = Path(out)
    tok = write_tokenizer(root / TOKENIZER_DIR, size)
    data = write_dataset(root / DATASET_DIR, size, documents, words_per_document, seed)
    return AssetPaths(root=root, tokenizer_dir=tok, dataset_dir=data, vocab_size=size, documents=documents,
                      words_per_document=words_per_document)


# ------------------------------------------------------------------------------------------------------- command
@click.command("torchtitan")
@click.option("--model", "model", required=True, help="Model preset whose vocabulary size the tokenizer takes "
              "(e.g. llama3-8b, llama2-7b).")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Directory to write into.")
@click.option("--documents", default=256, show_default=True, type=click.IntRange(min=1),
              help="Documents in the synthetic dataset.")
@click.option("--words", "words", default=4096, show_default=True, type=click.IntRange(min=1),
              help="Words (tokens) per document.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the generated text.")
def assets_torchtitan_cmd(model: str, out: str, documents: int, words: int, seed: int) -> None:
    """Tokenizer and dataset for TorchTitan: use the printed flags.

    \b
    Example:
      phantora assets torchtitan --model llama3-8b --out assets/llama3
    """
    try:
        paths = write_torchtitan_assets(out, model=model, documents=documents, words_per_document=words, seed=seed)
    except PhantoraError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"--out {out}: could not write {exc.filename or out} "
                                   f"({exc.strerror or exc})") from None
    click.echo(f"tokenizer: {paths.tokenizer_dir} ({paths.vocab_size} tokens)")
    click.echo(f"dataset:   {paths.dataset_dir / DATASET_FILE} ({documents} documents of {words} words)")
    click.echo(f"flags:     --hf_assets_path {paths.tokenizer_dir} --dataloader.dataset c4_test "
               f"--dataloader.dataset_path {paths.dataset_dir}")
