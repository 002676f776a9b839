"""The shipped GPT-2 tokenizer folder loads through transformers' AutoTokenizer, the way a user loads any
tokenizer folder, and tokenizes exactly as GPT-2 does."""

from __future__ import annotations

import transformers

from bcos_plugins.data import SHIPPED_DATA

FOLDER = SHIPPED_DATA / "gpt2_tokenizer"
TEXT = "Hello world. When Mary and John went to the store, John gave a drink to"


def test_auto_tokenizer_loads_the_shipped_gpt2_folder_as_gpt2():
    # Without tokenizer_config.json AutoTokenizer could not tell the class and failed with "You need to have
    # sentencepiece or tiktoken installed".
    auto = transformers.AutoTokenizer.from_pretrained(FOLDER)
    explicit = transformers.GPT2Tokenizer.from_pretrained(FOLDER)
    assert type(auto) is type(explicit)
    assert auto("Hello world")["input_ids"] == [15496, 995]  # GPT-2's ids (SOURCE.md)
    assert auto(TEXT)["input_ids"] == explicit(TEXT)["input_ids"]
    assert (auto.bos_token, auto.eos_token, auto.unk_token) == ("<|endoftext|>",) * 3
    assert auto.eos_token_id == 50256 and len(auto) == 50257
    assert auto.decode(auto(TEXT)["input_ids"]) == TEXT
