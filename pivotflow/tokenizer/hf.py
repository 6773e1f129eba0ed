"""A Hugging Face tokenizer (a ``tokenizers`` backend plus its config) behind ``base.Tokenizer``.

Encoding and decoding are the ``tokenizers`` backend's, as in transformers' fast tokenizers;
the special tokens, chat templates and extra stop ids are what the folder's config files say
(``load.py`` reads them). ``save`` writes a folder that ``AutoTokenizer.from_pretrained`` loads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers

from pivotflow.errors import TokenizerError
from pivotflow.tokenizer import chat_template as templates
from pivotflow.tokenizer.base import Message
from pivotflow.tokenizer.incremental import WindowDetokenizer

# The named special tokens transformers knows, in its order; templates see them as variables.
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                "mask_token")
DEFAULT_CLASS = "PreTrainedTokenizerFast"  # loads in transformers 4 and 5 from tokenizer.json


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` with its special tokens, stop ids and chat templates.

    Build one with ``load_tokenizer(folder)`` or ``HFTokenizer.from_parts(...)``; the
    constructor takes what those have already checked.
    """

    def __init__(self, backend: tokenizers.Tokenizer, *, name_or_path: str,
                 named_tokens: Mapping[str, str], chat_templates: Mapping[str, str] | None = None,
                 extra_eos_ids: Sequence[int] = (), pad_id: int | None = None,
                 model_max_length: int | None = None, clean_up_spaces: bool = False,
                 source_config: Mapping[str, Any] | None = None, template_file: bool = False,
                 where: str = "tokenizer") -> None:
        # transformers turns both off for a plain encode call; a tokenizer.json that pads or
        # truncates would otherwise change every prompt
        backend.no_padding()
        backend.no_truncation()
        self.backend = backend
        self.name_or_path = name_or_path
        self.where = where  # the file errors about templates name
        self._mark_named_special(named_tokens)
        self.named_tokens = dict(named_tokens)  # transformers' special_tokens_map
        vocab = backend.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values(), default=-1) + 1
        if "eos_token" not in named_tokens:
            raise TokenizerError(f"{where}: no eos_token is set")
        self.eos_id = self._id_of("eos_token")
        self.eos_ids = tuple(dict.fromkeys([self.eos_id, *extra_eos_ids]))
        for i in (*self.eos_ids, pad_id):
            if i is not None and not 0 <= i < self.vocab_size:
                raise TokenizerError(f"{where}: stop or pad id {i} is outside the vocabulary "
                                     f"(0..{self.vocab_size - 1})")
        if "pad_token" in named_tokens:
            self.pad_id = self._id_of("pad_token")
        else:
            self.pad_id = pad_id if pad_id is not None else self.eos_id
        self.bos_id = self._id_of("bos_token") if "bos_token" in named_tokens else None
        added = backend.get_added_tokens_decoder()
        self.special_ids = frozenset(
            [i for i, t in added.items() if t.special]
            + [self._id_of(k) for k in named_tokens])
        self.model_max_length = model_max_length
        self.chat_templates = dict(chat_templates or {})
        self.chat_template = self.chat_templates.get("default")
        self._clean_up = clean_up_spaces and type(backend.model).__name__ != "BPE"
        self._source_config = dict(source_config or {})
        self._template_file = template_file

    @classmethod
    def from_parts(cls, tokenizer: tokenizers.Tokenizer, *, eos_token: str,
                   pad_token: str | None = None, bos_token: str | None = None,
                   chat_template: str | None = None, extra_eos_ids: tuple[int, ...] = (),
                   name_or_path: str = "") -> HFTokenizer:
        """A tokenizer built in code (the bootstrap's). The named tokens must be in the
        vocabulary; they become special tokens, as transformers makes them. BOS is added by
        ``encode(add_special_tokens=True)`` only if ``tokenizer``'s post-processor adds it."""
        backend = tokenizers.Tokenizer.from_str(tokenizer.to_str())  # ours to configure
        named = {k: v for k, v in (("bos_token", bos_token), ("eos_token", eos_token),
                                   ("pad_token", pad_token)) if v is not None}
        for key, token in named.items():
            if backend.token_to_id(token) is None:
                raise TokenizerError(f"{key} {token!r} is not in the tokenizer's vocabulary")
        if chat_template is not None:
            templates.check_template(chat_template, "chat_template")
        return cls(backend, name_or_path=name_or_path, named_tokens=named,
                   chat_templates={"default": chat_template} if chat_template else None,
                   extra_eos_ids=extra_eos_ids, template_file=chat_template is not None,
                   where="HFTokenizer.from_parts")

    def _mark_named_special(self, named: Mapping[str, str]) -> None:
        """A named token in the vocabulary but not among the added tokens becomes a special
        added token (same id), as transformers does on load; skip_special then skips it."""
        added = {t.content for t in self.backend.get_added_tokens_decoder().values()}
        missing = [t for t in dict.fromkeys(named.values()) if t not in added]
        if missing:
            self.backend.add_special_tokens(
                [tokenizers.AddedToken(t, special=True, normalized=False) for t in missing])

    def _id_of(self, key: str) -> int:
        token = self.named_tokens[key]
        i = self.backend.token_to_id(token)
        if i is None:
            raise TokenizerError(f"{self.where}: {key} {token!r} is not in the vocabulary")
        return i

    def token_id(self, token: str) -> int | None:
        """The id of one token (``"<tool_call>"``), or None if it is not in the vocabulary."""
        return self.backend.token_to_id(token)

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        seq = ids if isinstance(ids, list) else list(ids)
        # the backend silently drops an unknown id; a wrong id must not pass unnoticed
        if seq and (min(seq) < 0 or max(seq) >= self.vocab_size):
            bad = next(t for t in seq if not 0 <= t < self.vocab_size)
            raise TokenizerError(f"token id {bad} is outside the vocabulary "
                                 f"(0..{self.vocab_size - 1}) of {self.name_or_path}")
        text = self.backend.decode(seq, skip_special_tokens=skip_special)
        return _clean_up(text) if self._clean_up else text

    def stream(self, *, skip_special: bool = True) -> WindowDetokenizer:
        return WindowDetokenizer(lambda ids: self.decode(ids, skip_special=skip_special))

    def apply_chat_template(self, messages: Sequence[Message], *,
                            add_generation_prompt: bool = True,
                            tools: Sequence[dict[str, Any]] | None = None,
                            **kwargs: Any) -> str:
        """As transformers' ``apply_chat_template(tokenize=False)``: ``documents=`` and
        ``chat_template=`` (a template's name or source) as there, other kwargs are template
        variables (``enable_thinking=False``) that override the special tokens."""
        documents = kwargs.pop("documents", None)
        source = self._template_for(kwargs.pop("chat_template", None), tools)
        return templates.render(source, messages, add_generation_prompt=add_generation_prompt,
                                tools=tools, documents=documents,
                                variables={**self.named_tokens, **kwargs}, where=self.where)

    def _template_for(self, chosen: str | None, tools: object) -> str:
        # transformers' choice: a named template, else "tool_use" when tools come, else default
        if chosen is not None:
            source = self.chat_templates.get(chosen, chosen)
            templates.check_template(source, "chat_template=")
            return source
        if tools is not None and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        if self.chat_template is not None:
            return self.chat_template
        if self.chat_templates:
            raise TokenizerError(f"{self.where}: several chat templates "
                                 f"({', '.join(sorted(self.chat_templates))}) and none is "
                                 "'default'; pass chat_template=NAME")
        raise TokenizerError(f"{self.name_or_path}: the tokenizer has no chat template "
                             "(no chat_template.jinja, no 'chat_template' in "
                             "tokenizer_config.json)")

    def save(self, directory: str | Path) -> None:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(out / "tokenizer.json"))
        config = self._config_to_save()
        if self._template_file and self.chat_templates:
            for name, source in self.chat_templates.items():
                if name == "default":
                    (out / "chat_template.jinja").write_text(source, encoding="utf-8")
                else:
                    extra = out / "additional_chat_templates"
                    extra.mkdir(exist_ok=True)
                    (extra / f"{Path(name).name}.jinja").write_text(source, encoding="utf-8")
        elif set(self.chat_templates) == {"default"}:
            config["chat_template"] = self.chat_template
        elif self.chat_templates:
            config["chat_template"] = [{"name": k, "template": v}
                                       for k, v in self.chat_templates.items()]
        _write_json(out / "tokenizer_config.json", config)
        _write_json(out / "special_tokens_map.json", dict(self.named_tokens))
        extra_eos = self.eos_ids[1:]
        if extra_eos and not (out / "generation_config.json").exists():
            # the stop ids live there; a checkpoint writer may write a fuller one over it
            _write_json(out / "generation_config.json",
                        {"eos_token_id": list(self.eos_ids), "pad_token_id": self.pad_id})

    def _config_to_save(self) -> dict[str, Any]:
        src = self._source_config
        config = {k: v for k, v in src.items()
                  if k not in ("chat_template", "added_tokens_decoder", "tokenizer_file",
                               "auto_map", "name_or_path", *NAMED_TOKENS)}
        cls = src.get("tokenizer_class")
        # a class of transformers' own loaded this folder; remote code or a backend name may
        # not load elsewhere, and PreTrainedTokenizerFast reads tokenizer.json as it is
        keep = (isinstance(cls, str) and "auto_map" not in src
                and cls.endswith(("Tokenizer", "TokenizerFast")))
        config["tokenizer_class"] = cls if keep else DEFAULT_CLASS
        config.update(self.named_tokens)
        config["added_tokens_decoder"] = {
            str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
                     "rstrip": t.rstrip, "single_word": t.single_word, "special": t.special}
            for i, t in sorted(self.backend.get_added_tokens_decoder().items())}
        if self.model_max_length is not None:
            config["model_max_length"] = self.model_max_length
        config.setdefault("clean_up_tokenization_spaces", False)
        return config


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _clean_up(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (for word-piece tokenizers; never for BPE)."""
    return (text.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",")
            .replace(" ' ", "'").replace(" n't", "n't").replace(" 'm", "'m")
            .replace(" 's", "'s").replace(" 've", "'ve").replace(" 're", "'re"))
