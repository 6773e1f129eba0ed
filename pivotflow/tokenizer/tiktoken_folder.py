"""Tokenizer folders in tiktoken's form (Kimi K2's, Moonlight's): ``tiktoken.model`` holds
the byte-level BPE ranks, one ``<base64 token> <rank>`` a line, and the pattern that splits
text before BPE lives in the folder's own Python tokenizer class (``pat_str``, the class
``tokenizer_config.json``'s ``auto_map`` names), which transformers runs as remote code.

pivotflow runs no code from a model folder: it reads that file as text and takes ``pat_str``
(and ``num_reserved_special_tokens``) from the class body when they are literals, strings
joined with ``"|".join([...])`` or ``+`` included (``_class_constants``). It then builds the
equivalent ``tokenizers`` BPE, as transformers' TikTokenConverter does: every token's
vocabulary entry in byte-level form, a merge for each way a token splits into two tokens,
ordered by the merged token's rank, and whole pieces found in the vocabulary taken as they are
(``ignore_merges``: tiktoken's first check). The reserved special tokens follow the ranks
(256 of them for Kimi: the named ones from ``added_tokens_decoder``, the rest
``<|reserved_token_N|>``). Tests hold the result to tiktoken itself.
"""

from __future__ import annotations

import ast
import base64
import binascii
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers

from pivotflow.errors import TokenizerError

TIKTOKEN_FILE = "tiktoken.model"
RESERVED_SPECIAL = 256  # Kimi's num_reserved_special_tokens, where its class names none


def tiktoken_backend(folder: Path, config: dict[str, Any]) -> tokenizers.Tokenizer:
    """The ``tokenizers`` equivalent of the folder's tiktoken tokenizer. Raises
    TokenizerError naming the file and line or key that is wrong."""
    ranks = read_ranks(folder / TIKTOKEN_FILE)
    constants = _class_constants(folder, config)
    pattern = constants.get("pat_str")
    if not isinstance(pattern, str):
        raise TokenizerError(f"{folder}: {TIKTOKEN_FILE} needs its tokenizer class's pat_str "
                             "(the pattern that splits text before BPE) as a literal; found "
                             f"{'none' if pattern is None else type(pattern).__name__}")
    reserved = constants.get("num_reserved_special_tokens", RESERVED_SPECIAL)
    if isinstance(reserved, bool) or not isinstance(reserved, int) or reserved < 0:
        raise TokenizerError(f"{folder}: num_reserved_special_tokens={reserved!r} is not a "
                             "count")
    to_text = _byte_text()
    vocab = {to_text(token): rank for token, rank in ranks.items()}
    merges = [(to_text(left), to_text(right)) for left, right in _merges(ranks)]
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    try:
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
    except Exception as exc:  # (the Rust side raises a bare Exception)
        raise TokenizerError(f"{folder}: pat_str is not a pattern the tokenizers library "
                             f"compiles ({' '.join(str(exc).split())[:200]})") from None
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    names = _named_specials(config)
    base = len(ranks)
    backend.add_special_tokens([
        tokenizers.AddedToken(names.get(i, f"<|reserved_token_{i}|>"), special=True,
                              normalized=False) for i in range(base, base + reserved)])
    return backend


def read_ranks(path: Path) -> dict[bytes, int]:
    """tiktoken's ranks file: ``<base64 token> <rank>`` a line, ranks 0..n-1 each once."""
    if not path.is_file():
        raise TokenizerError(f"{path}: missing")
    ranks: dict[bytes, int] = {}
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.split()
            try:
                if len(parts) != 2:
                    raise ValueError
                token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
            except (ValueError, binascii.Error):
                raise TokenizerError(f"{path}: line {n} is not '<base64 token> <rank>'") from None
            if token in ranks:
                raise TokenizerError(f"{path}: line {n} repeats a token of rank {ranks[token]}")
            ranks[token] = rank
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise TokenizerError(f"{path}: ranks are not 0..{len(ranks) - 1}, each once")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise TokenizerError(f"{path}: byte {missing[0]} has no token (byte-level BPE needs "
                             "all 256)")
    return ranks


def _merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every (left, right) pair of tokens that concatenates to a token, ordered by that
    token's rank (then by the parts' ranks, as TikTokenConverter orders them)."""
    found = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                found.append((rank, ranks[left], ranks[right], left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def _byte_text() -> Any:
    """bytes -> the byte-level BPE's text for them (GPT-2's printable stand-in per byte)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):  # (GPT-2's bytes_to_unicode)
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    assert set(table.values()) == set(alphabet)
    return lambda token: "".join(table[b] for b in token)


def _named_specials(config: dict[str, Any]) -> dict[int, str]:
    """The config's added_tokens_decoder as id -> text (its checks are load.py's)."""
    table = config.get("added_tokens_decoder")
    if not isinstance(table, dict):
        return {}
    return {int(k): v["content"] for k, v in table.items()
            if str(k).isdigit() and isinstance(v, dict) and isinstance(v.get("content"), str)}


def _class_constants(folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The literal class attributes of the tokenizer class ``auto_map`` names (else of the
    one class among the folder's ``tokenization_*.py`` that sets ``pat_str``), read as text."""
    module, cls = _auto_map_class(config)
    files = [folder / f"{module}.py"] if module else sorted(folder.glob("tokenization_*.py"))
    for path in files:
        if not path.is_file():
            raise TokenizerError(f"{folder}: tokenizer_config.json's auto_map names "
                                 f"{module}.{cls}, and {path.name} is missing")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
            raise TokenizerError(f"{path}: not Python pivotflow can read "
                                 f"({' '.join(str(exc).split())[:120]})") from None
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and (cls is None or node.name == cls):
                constants = _literals(node)
                if "pat_str" in constants or cls is not None:
                    return constants
    return {}


def _auto_map_class(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """(module, class) of ``auto_map.AutoTokenizer``'s slow tokenizer, or (None, None)."""
    entry = (config.get("auto_map") or {}).get("AutoTokenizer") if isinstance(
        config.get("auto_map"), dict) else None
    name = entry[0] if isinstance(entry, list) and entry else entry
    if not isinstance(name, str) or "." not in name:
        return None, None
    module, cls = name.rsplit(".", 1)
    return module.rsplit("--", 1)[-1], cls  # (a Hub reference "repo--module.Class")


def _literals(node: ast.ClassDef) -> dict[str, Any]:
    """The class body's ``name = <literal>`` assignments (strings joined or added allowed)."""
    out: dict[str, Any] = {}
    for stmt in node.body:
        target = value = None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        if isinstance(target, ast.Name) and value is not None:
            try:
                out[target.id] = _literal(value)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                continue  # (not a literal: a name, a call... pivotflow runs nothing)
    return out


def _literal(node: ast.expr) -> Any:
    """A literal, ``"sep".join([literal strings])`` or ``str + str``; ValueError otherwise."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "join" and len(node.args) == 1 and not node.keywords:
        sep, parts = _literal(node.func.value), _literal(node.args[0])
        if isinstance(sep, str) and isinstance(parts, list | tuple) and all(
                isinstance(p, str) for p in parts):
            return sep.join(parts)
        raise ValueError
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left), _literal(node.right)
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        raise ValueError
    return ast.literal_eval(node)
