"""Kimi K2's and Moonlight's tokenizer folders (tiktoken's ``tiktoken.model`` and a remote-code
class holding the pre-tokenizing pattern): pivotflow reads the pattern as text, never runs the
file, and its BPE encodes every text as tiktoken itself does with the same ranks and pattern.
The ranks here come from a byte-level BPE trained in the test on mixed scripts; the pattern
and the tokenizer class's shape are Kimi K2's."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from pivotflow.errors import TokenizerError
from pivotflow.tokenizer import load_tokenizer
from pivotflow.tokenizer.hf import HFTokenizer

tiktoken = pytest.importorskip("tiktoken")
tokenizers = pytest.importorskip("tokenizers")

KIMI_PATTERN = [
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",  # noqa: E501
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",  # noqa: E501
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
]
# a tokenizer class as Kimi's folders ship it (tokenization_kimi.py); importing it would write
# a marker file: pivotflow must read it, not run it
_PATTERN_LINES = "\n".join(f'            r"""{p}""",' for p in KIMI_PATTERN)
CLASS_FILE = f'''
from pathlib import Path
Path(__file__).with_name("IMPORTED").write_text("ran")

class TikTokenTokenizer:
    vocab_files_names = {{"vocab_file": "tiktoken.model"}}
    num_reserved_special_tokens = 256
    pat_str = "|".join(
        [
{_PATTERN_LINES}
        ]
    )

    def __init__(self, vocab_file, **kwargs):
        raise RuntimeError("never built here")
'''
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2026; we're training models.",
    "def train(step: int) -> float:\n    return 0.5 * step ** 2  # loss\n",
    "强化学习的奖励模型需要大量的数据和计算资源。模型在训练中不断改进。",
    "日本語のテキストも少し含めます。カタカナとひらがな。",
    "Numbers 1234567 and 3.14159, emails a.b@c.de, URLs https://x.y/z?q=1",
    "Emoji 🙂🚀 and accents: café, naïve, Ünïcödé; Привет мир; مرحبا",
    "    indented\n\n\n\ttabs\t\tand   spaces   ",
] * 20
TEXTS = [
    "Hello, World! I'M here and YOU'RE there; they'd've gone.",
    "奖励模型 and 强化学习 mixed with English words",
    "x=123456789; y = 0.000314 * 2e10",
    "Unseen words: antidisestablishmentarianism, Pneumonoultramicroscopic.",
    "  leading spaces\n\n\n  and trailing   \t\n",
    "🙂🙂🚀 emoji runs, Ελληνικά, 한국어 텍스트, עברית",
    "CamelCaseWords and snake_case_words and SCREAMING_CASE",
    "",
]


def _ranks(corpus: list[str], size: int) -> dict[bytes, int]:
    """Byte-level BPE ranks trained on ``corpus``: the 256 bytes, then each merge's token in
    the order the trainer learnt them (a token's rank above its parts')."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus, tokenizers.trainers.BpeTrainer(
        vocab_size=size, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    merges = json.loads(tok.to_str())["model"]["merges"]
    alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
    from pivotflow.tokenizer.tiktoken_folder import _byte_text

    to_text = _byte_text()
    to_bytes = {to_text(bytes([b])): bytes([b]) for b in range(256)}
    assert set(to_bytes) == set(alphabet)
    ranks = {bytes([b]): b for b in range(256)}
    for merge in merges:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        token = b"".join(to_bytes[c] for c in left + right)
        ranks.setdefault(token, len(ranks))
    return ranks


def _kimi_folder(root: Path, ranks: dict[bytes, int]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "tiktoken.model").write_bytes(b"".join(
        base64.b64encode(t) + b" " + str(r).encode() + b"\n" for t, r in ranks.items()))
    (root / "tokenization_kimi.py").write_text(CLASS_FILE)
    n = len(ranks)
    named = {n: "[BOS]", n + 1: "[EOS]", n + 2: "<|im_end|>", n + 3: "<|im_user|>",
             n + 4: "<|im_assistant|>", n + 5: "<|im_middle|>"}
    (root / "tokenizer_config.json").write_text(json.dumps({
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "tokenizer_class": "TikTokenTokenizer", "bos_token": "[BOS]", "eos_token": "[EOS]",
        "added_tokens_decoder": {str(i): {"content": t, "special": True}
                                 for i, t in named.items()},
        "chat_template": "{% for m in messages %}<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>"
                         "{{ m.content }}<|im_end|>{% endfor %}"
                         "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>"
                         "{% endif %}"}))
    return root


@pytest.fixture(scope="module")
def kimi(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[bytes, int]]:
    ranks = _ranks(CORPUS, 1200)
    return _kimi_folder(tmp_path_factory.mktemp("kimi"), ranks), ranks


def _reference(ranks: dict[bytes, int], specials: dict[str, int]) -> object:
    return tiktoken.Encoding(name="kimi-test", pat_str="|".join(KIMI_PATTERN),
                             mergeable_ranks=ranks, special_tokens=specials)


def test_a_tiktoken_folder_encodes_as_tiktoken_and_its_class_file_never_runs(
        kimi: tuple[Path, dict[bytes, int]]) -> None:
    folder, ranks = kimi
    tok = load_tokenizer(folder)
    assert isinstance(tok, HFTokenizer) and not (folder / "IMPORTED").exists()
    n = len(ranks)
    specials = {f"<|reserved_token_{i}|>": i for i in range(n, n + 256)}
    specials.update({"[BOS]": n, "[EOS]": n + 1, "<|im_end|>": n + 2, "<|im_user|>": n + 3,
                     "<|im_assistant|>": n + 4, "<|im_middle|>": n + 5})
    ref = _reference(ranks, specials)
    assert tok.vocab_size == n + 256 and tok.eos_ids[0] == n + 1
    for text in [*TEXTS, *CORPUS[:7]]:
        ids = tok.encode(text)
        assert ids == ref.encode(text, allowed_special="all"), text  # type: ignore[attr-defined]
        assert tok.decode(ids) == text
    chat = "<|im_user|>user<|im_middle|>你好, Kimi!<|im_end|><|im_assistant|>"
    assert tok.encode(chat) == ref.encode(chat, allowed_special="all")  # type: ignore[attr-defined]
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "2+2?"}],
                                             add_generation_prompt=True))
    assert ids[0] == n + 3 and ids[-1] == n + 5 and (n + 4) in ids


def test_a_saved_tiktoken_tokenizer_is_a_tokenizer_json_that_transformers_loads(
        kimi: tuple[Path, dict[bytes, int]], tmp_path: Path) -> None:
    """What a checkpoint carries: tokenizer.json and its config without the remote class, so
    transformers (and vLLM) load it as a fast tokenizer with no code from the folder."""
    transformers = pytest.importorskip("transformers")
    folder, _ = kimi
    tok = load_tokenizer(folder)
    tok.save(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    assert "auto_map" not in json.loads((tmp_path / "tokenizer_config.json").read_text())
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert theirs.encode(text, add_special_tokens=False) == tok.encode(text), text


def _edit(folder: Path, name: str, text: str | bytes) -> None:
    path = folder / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


@pytest.mark.parametrize(("name", "content", "message"), [
    ("tiktoken.model", b"QUJD 0\nnot-base64!! 1\n", "tiktoken.model: line 2 is not "
                                                    "'<base64 token> <rank>'"),
    ("tiktoken.model", b"QQ== 0\nQg== 5\n", "tiktoken.model: ranks are not 0..1, each once"),
    ("tokenization_kimi.py", "class TikTokenTokenizer:\n    pat_str = PATTERN\n",
     "tiktoken.model needs its tokenizer class's pat_str (the pattern that splits text before "
     "BPE) as a literal; found none"),
    ("tokenization_kimi.py", "class TikTokenTokenizer:\n    pat_str = '(unclosed'\n",
     "pat_str is not a pattern the tokenizers library compiles"),
    ("tokenization_kimi.py", "def broken(:\n", "tokenization_kimi.py: not Python pivotflow "
                                               "can read"),
])
def test_a_bad_tiktoken_folder_is_a_one_line_error(
        kimi: tuple[Path, dict[bytes, int]], tmp_path: Path, name: str, content: str | bytes,
        message: str) -> None:
    folder = _kimi_folder(tmp_path / "kimi", kimi[1])
    _edit(folder, name, content)
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(folder)
    text = str(err.value)
    assert message in text and "\n" not in text and len(text) < 400, text
