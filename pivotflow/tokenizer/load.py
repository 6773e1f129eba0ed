"""``load_tokenizer(folder)``: read a Hugging Face tokenizer folder (or an old char one).

Reads what transformers reads: tokenizer.json (the ``tokenizers`` serialization; or, where a
folder has none, tiktoken's ``tiktoken.model``: ``tiktoken_folder``),
tokenizer_config.json (special tokens, added tokens, chat templates, model_max_length),
chat_template.jinja and additional_chat_templates/*.jinja (they win over the config's
template, as in transformers), special_tokens_map.json; and generation_config.json, whose
eos ids are extra stop tokens. Every error is one line naming the file and the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tokenizers

from pivotflow.errors import TokenizerError
from pivotflow.tokenizer.base import Tokenizer
from pivotflow.tokenizer.char import CharTokenizer
from pivotflow.tokenizer.chat_template import check_template
from pivotflow.tokenizer.hf import NAMED_TOKENS, HFTokenizer
from pivotflow.tokenizer.tiktoken_folder import TIKTOKEN_FILE, tiktoken_backend

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
SPECIAL_MAP_FILE = "special_tokens_map.json"
GENERATION_FILE = "generation_config.json"


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of the folder ``path`` (a model folder or a tokenizer-only one)."""
    folder = Path(path)
    if not folder.is_dir():
        raise TokenizerError(f"{folder}: no such tokenizer folder")
    tok_file = folder / TOKENIZER_FILE
    if not tok_file.is_file() and (folder / TIKTOKEN_FILE).is_file():
        # (Kimi K2's and Moonlight's: tiktoken ranks, read as the equivalent BPE)
        config = _optional_object(folder / CONFIG_FILE)
        backend = tiktoken_backend(folder, config)
    else:
        if not tok_file.is_file():
            raise TokenizerError(
                f"{tok_file}: missing (a tokenizer folder needs tokenizer.json, or tiktoken's "
                f"{TIKTOKEN_FILE}; convert an old one with AutoTokenizer.from_pretrained(...)"
                ".save_pretrained(...))")
        text = tok_file.read_text(encoding="utf-8")
        data = _parse(tok_file, text)
        if isinstance(data, dict) and data.get("type") == "char":
            return CharTokenizer.from_dict(data, where=str(tok_file), name_or_path=str(folder))
        try:
            backend = tokenizers.Tokenizer.from_str(text)
        except Exception as exc:  # the Rust side raises a bare Exception
            raise TokenizerError(f"{tok_file}: not a tokenizers serialization "
                                 f"({_one_line(str(exc))})") from None
        config = _optional_object(folder / CONFIG_FILE)
    named = _named_tokens(folder, config)
    _add_config_tokens(backend, folder / CONFIG_FILE, config)
    _add_missing_named(backend, folder, named)
    chat_templates, from_file = _chat_templates(folder, config)
    extra_eos, pad_id = _generation_ids(folder / GENERATION_FILE)
    size = max(backend.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    for key, i in [*(("eos_token_id", i) for i in extra_eos), ("pad_token_id", pad_id)]:
        if i is not None and not 0 <= i < size:
            raise TokenizerError(f"{folder / GENERATION_FILE}: {key} {i} is outside the "
                                 f"vocabulary (0..{size - 1})")
    where = str(folder / (TEMPLATE_FILE if from_file else CONFIG_FILE))
    return HFTokenizer(backend, name_or_path=str(folder), named_tokens=named,
                       chat_templates=chat_templates, extra_eos_ids=extra_eos, pad_id=pad_id,
                       model_max_length=_max_length(config),
                       clean_up_spaces=config.get("clean_up_tokenization_spaces") is True,
                       source_config=config, template_file=from_file, where=where)


def _parse(path: Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TokenizerError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: "
                             f"{exc.msg})") from None


def _optional_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = _parse(path, path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: must hold a JSON object, not a {type(data).__name__}")
    return data


def _token_text(value: Any, path: Path, key: str) -> str | None:
    """A special token given as a string or as an AddedToken dict ``{"content": ...}``."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerError(f"{path}: key {key!r} must be a string or {{\"content\": ...}}")


def _named_tokens(folder: Path, config: dict[str, Any]) -> dict[str, str]:
    """bos/eos/pad/... from tokenizer_config.json, then special_tokens_map.json for the rest."""
    special_map = _optional_object(folder / SPECIAL_MAP_FILE)
    named: dict[str, str] = {}
    for key in NAMED_TOKENS:
        for path, source in ((folder / CONFIG_FILE, config),
                             (folder / SPECIAL_MAP_FILE, special_map)):
            if key in source:
                text = _token_text(source[key], path, key)
                if text is not None:
                    named[key] = text
                break  # a key set to null in the config stays unset
    if "eos_token" not in named:
        raise TokenizerError(f"{folder / CONFIG_FILE}: no 'eos_token' (and none in "
                             f"{SPECIAL_MAP_FILE})")
    return named


def _add_config_tokens(backend: tokenizers.Tokenizer, path: Path, config: dict[str, Any]) -> None:
    """Tokens of the config's ``added_tokens_decoder`` that tokenizer.json lacks, added at the
    ids the config gives (transformers adds them too)."""
    table = config.get("added_tokens_decoder", {})
    if not isinstance(table, dict):
        raise TokenizerError(f"{path}: key 'added_tokens_decoder' must be an object")
    have = {t.content for t in backend.get_added_tokens_decoder().values()}
    entries = []
    for key, entry in table.items():
        content = entry.get("content") if isinstance(entry, dict) else None
        if not (str(key).isdigit() and isinstance(content, str)):
            raise TokenizerError(f"{path}: key 'added_tokens_decoder.{key}' must map an id to "
                                 "{\"content\": ...}")
        if content not in have:
            entries.append((int(key), content, entry))
    for i, content, entry in sorted(entries):
        token = tokenizers.AddedToken(
            content, special=bool(entry.get("special", False)),
            lstrip=bool(entry.get("lstrip", False)), rstrip=bool(entry.get("rstrip", False)),
            single_word=bool(entry.get("single_word", False)),
            normalized=bool(entry.get("normalized", not entry.get("special", False))))
        backend.add_tokens([token])
        if backend.token_to_id(content) != i:
            raise TokenizerError(f"{path}: key 'added_tokens_decoder.{i}' ({content!r}) would "
                                 f"get id {backend.token_to_id(content)}, not {i}")


def _add_missing_named(backend: tokenizers.Tokenizer, folder: Path,
                       named: dict[str, str]) -> None:
    """The eos token must be in the vocabulary (the model was trained to end with it); other
    named tokens missing from it are added as new special tokens, as transformers adds them."""
    eos = named["eos_token"]
    if backend.token_to_id(eos) is None:
        raise TokenizerError(f"{folder / CONFIG_FILE}: key 'eos_token' ({eos[:40]!r}) is not in "
                             f"the vocabulary of {TOKENIZER_FILE}")
    missing = [t for t in dict.fromkeys(named.values()) if backend.token_to_id(t) is None]
    if missing:
        backend.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                                    for t in missing])


def _chat_templates(folder: Path, config: dict[str, Any]) -> tuple[dict[str, str], bool]:
    """(name -> template, whether they came from .jinja files); each one compiles."""
    found: dict[str, str] = {}
    file = folder / TEMPLATE_FILE
    if file.is_file():
        found["default"] = file.read_text(encoding="utf-8")
        check_template(found["default"], str(file))
    extra = folder / TEMPLATE_DIR
    if extra.is_dir():
        for path in sorted(extra.glob("*.jinja")):
            found[path.stem] = path.read_text(encoding="utf-8")
            check_template(found[path.stem], str(path))
    if found:
        return found, True
    cfg_path = folder / CONFIG_FILE
    value = config.get("chat_template")
    if value is None:
        return {}, False
    if isinstance(value, str):
        check_template(value, f"{cfg_path} key 'chat_template'")
        return {"default": value}, False
    if not isinstance(value, list):
        raise TokenizerError(f"{cfg_path}: key 'chat_template' must be a string or a list of "
                             "{\"name\": ..., \"template\": ...}")
    for n, entry in enumerate(value):
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)):
            raise TokenizerError(f"{cfg_path}: key 'chat_template[{n}]' must be "
                                 "{\"name\": ..., \"template\": ...}")
        check_template(entry["template"], f"{cfg_path} key 'chat_template[{n}]' "
                                          f"({entry['name'][:40]!r})")
        found[entry["name"]] = entry["template"]
    return found, False


def _generation_ids(path: Path) -> tuple[tuple[int, ...], int | None]:
    """generation_config.json's eos ids (an int or a list) and pad id, if the file is there."""
    config = _optional_object(path)
    eos = config.get("eos_token_id")
    if eos is None:
        ids: list[Any] = []
    elif isinstance(eos, list):
        ids = eos
    else:
        ids = [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise TokenizerError(f"{path}: key 'eos_token_id' must be an int or a list of ints")
    pad = config.get("pad_token_id")
    if pad is not None and (not isinstance(pad, int) or isinstance(pad, bool)):
        raise TokenizerError(f"{path}: key 'pad_token_id' must be an int")
    return tuple(ids), pad


def _max_length(config: dict[str, Any]) -> int | None:
    value = config.get("model_max_length")
    # transformers writes 1e30 ("no limit") when the folder does not say
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e12:
        return int(value)
    return None


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
