"""HFTokenizer against transformers on a folder transformers wrote: same ids, same text, same
special tokens; ``save`` writes a folder transformers loads back to the same tokenizer."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tok_fixtures import CORPUS, Saver
from tokenizers import Tokenizer, processors
from transformers import AutoTokenizer

from pivotflow.errors import TokenizerError
from pivotflow.tokenizer import (
    CharTokenizer,
    HFTokenizer,
    default_tokenizer,
    load_tokenizer,
)
from pivotflow.tokenizer import (
    Tokenizer as TokenizerProtocol,
)

TEXTS = [*CORPUS, "", " leading space", "trailing space ", "2026-12-02 07:48:33",
         "unseen words: xylophone quartz 🦄 雪", "<|im_start|>user\nhi<|im_end|>",
         "tabs\tand\r\nnewlines\n\n", "a" * 300]


def test_encode_and_decode_match_transformers(save_hf: Saver) -> None:
    folder = save_hf(pad_token="<|endoftext|>")
    ours, ref = load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    assert isinstance(ours, HFTokenizer) and isinstance(ours, TokenizerProtocol)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False), text
        assert ours.encode(text, add_special_tokens=True) == ref.encode(text), text
        for skip in (True, False):
            assert ours.decode(ids, skip_special=skip) == ref.decode(ids, skip_special_tokens=skip)
    rng = random.Random(0)
    for _ in range(30):  # any id sequence, byte pieces included, decodes as transformers does
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randrange(1, 40))]
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    assert ours.vocab_size == len(ref)
    assert ours.eos_id == ref.eos_token_id and ours.pad_id == ref.pad_token_id
    assert ours.bos_id is None and ref.bos_token_id is None
    assert ours.special_ids == frozenset(ref.all_special_ids) | {
        i for i, t in ref.added_tokens_decoder.items() if t.special}
    assert ours.eos_ids == (ours.eos_id,)


def test_digits_are_split_one_by_one(save_hf: Saver) -> None:
    tok = load_tokenizer(save_hf())
    ids = tok.encode("12345")
    assert len(ids) == 5 and [tok.decode([i]) for i in ids] == list("12345")


def test_pad_falls_back_to_eos_and_specials_are_skipped(save_hf: Saver) -> None:
    tok = load_tokenizer(save_hf())  # no pad token
    assert tok.pad_id == tok.eos_id
    ids = tok.encode("<|im_start|>hi<|im_end|>")
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special=False) == "<|im_start|>hi<|im_end|>"


def test_out_of_range_ids_are_refused(save_hf: Saver) -> None:
    tok = load_tokenizer(save_hf())
    for bad in ([tok.vocab_size], [-1], [1, 2, 10**6]):
        with pytest.raises(TokenizerError, match="outside the vocabulary"):
            tok.decode(bad)


def test_bos_comes_from_the_post_processor(bpe: Tokenizer, tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    llama = Tokenizer.from_str(bpe.to_str())
    bos = llama.token_to_id("<|begin_of_text|>")
    llama.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    PreTrainedTokenizerFast(tokenizer_object=llama, bos_token="<|begin_of_text|>",
                            eos_token="<|eot_id|>").save_pretrained(tmp_path)
    ours, ref = load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    assert ours.bos_id == bos == ref.bos_token_id
    assert ours.encode("hi", add_special_tokens=True) == ref.encode("hi") == [bos, *ours.encode("hi")]
    assert ours.encode("hi") == ref.encode("hi", add_special_tokens=False)


def test_generation_config_eos_ids_are_stop_ids(save_hf: Saver) -> None:
    folder = save_hf()
    tok0 = load_tokenizer(folder)
    endoftext = tok0.encode("<|endoftext|>")[0]
    eot = tok0.encode("<|eot_id|>")[0]
    (folder / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [endoftext, tok0.eos_id, eot], "pad_token_id": endoftext}))
    tok = load_tokenizer(folder)
    assert tok.eos_id == tok0.eos_id
    assert tok.eos_ids == (tok0.eos_id, endoftext, eot)
    assert tok.pad_id == endoftext  # no pad token: generation_config's pad id
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eot}))
    assert load_tokenizer(folder).eos_ids == (tok0.eos_id, eot)


def test_config_forms_of_special_tokens(save_hf: Saver) -> None:
    folder = save_hf()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["eos_token"] = {"__type": "AddedToken", "content": "<|eot_id|>", "special": True,
                           "lstrip": False, "rstrip": False, "normalized": False,
                           "single_word": False}  # the form transformers 4 wrote
    config["pad_token"] = "<|endoftext|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok, ref = load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    assert (tok.eos_id, tok.pad_id) == (ref.eos_token_id, ref.pad_token_id)


def test_config_added_tokens_are_added(save_hf: Saver) -> None:
    folder = save_hf()
    base = load_tokenizer(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {
        str(base.vocab_size): {"content": "<tool_call>", "special": False, "lstrip": False,
                               "rstrip": False, "normalized": False, "single_word": False}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok, ref = load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    assert tok.vocab_size == base.vocab_size + 1 == len(ref)
    text = "<tool_call>\n{}\n</tool_call>"
    assert tok.encode(text) == ref.encode(text, add_special_tokens=False)
    assert tok.token_id("<tool_call>") == base.vocab_size
    assert tok.decode(tok.encode(text)) == text  # not special: kept by skip_special


@pytest.mark.parametrize("with_template_file", [True, False])
def test_save_loads_in_transformers(save_hf: Saver, tmp_path: Path,
                                    with_template_file: bool) -> None:
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    folder = save_hf(pad_token="<|endoftext|>", chat_template=template)
    if not with_template_file:  # the older form: the template in tokenizer_config.json
        (folder / "chat_template.jinja").unlink()
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config["chat_template"] = template
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(folder)
    out = tmp_path / "saved"
    tok.save(out)
    assert (out / "chat_template.jinja").exists() == with_template_file
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == \
        "PreTrainedTokenizerFast"
    ref = AutoTokenizer.from_pretrained(out)
    again = load_tokenizer(out)
    msgs = [{"role": "user", "content": "2+2?"}]
    for text in TEXTS:
        assert ref.encode(text, add_special_tokens=False) == tok.encode(text) == again.encode(text)
    assert (ref.eos_token_id, ref.pad_token_id, len(ref)) == (tok.eos_id, tok.pad_id,
                                                              tok.vocab_size)
    assert ref.apply_chat_template(msgs, tokenize=False) == \
        again.apply_chat_template(msgs, add_generation_prompt=False)


def test_from_parts_saves_a_transformers_folder(bpe: Tokenizer, tmp_path: Path) -> None:
    endoftext = bpe.token_to_id("<|endoftext|>")
    template = "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
    tok = HFTokenizer.from_parts(bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 chat_template=template, extra_eos_ids=(endoftext,))
    assert tok.eos_ids == (tok.eos_id, endoftext) and tok.pad_id == endoftext
    tok.save(tmp_path)
    ref, again = AutoTokenizer.from_pretrained(tmp_path), load_tokenizer(tmp_path)
    assert ref.eos_token == "<|im_end|>" and ref.pad_token == "<|endoftext|>"
    assert again.eos_ids == tok.eos_ids  # via the generation_config.json save wrote
    msgs = [{"role": "user", "content": "héllo 42"}]
    assert ref.apply_chat_template(msgs, tokenize=False) == tok.apply_chat_template(msgs)
    for text in TEXTS:
        assert ref.encode(text, add_special_tokens=False) == tok.encode(text)
    with pytest.raises(TokenizerError, match="eos_token '<nope>' is not in"):
        HFTokenizer.from_parts(bpe, eos_token="<nope>")


def test_legacy_char_folder_loads_as_char_tokenizer(tmp_path: Path) -> None:
    default_tokenizer().save(tmp_path)
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, CharTokenizer) and isinstance(tok, TokenizerProtocol)
    assert tok.decode(tok.encode("1+1=2", add_special_tokens=True)) == "1+1=2"
