"""Chat formats render append-only contexts; templates are derived from the tokenizer's own."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from polyturn.models.actor import SMOLLM2_GGUF, smollm2_dir
from polyturn.models.chat import SIMPLE_FORMAT, chat_format_for, stop_token_id

pytestmark = pytest.mark.xdist_group("chat")  # one test process builds the module fixtures, once


def test_simple_format_is_used_without_a_template(tiny_tokenizer):
    fmt = chat_format_for(tiny_tokenizer)
    assert fmt is SIMPLE_FORMAT
    text = fmt.render_prefix("Find X", None) + "Action: list_tables[{}]" + fmt.end_text + fmt.render_observation("t1, t2")
    assert text == "<|user|>Find X<|end|>\n<|assistant|>Action: list_tables[{}]<|end|>\n<|tool|>t1, t2<|end|>\n<|assistant|>"
    assert fmt.render_prefix("Find X", "docs").startswith("<|system|>docs<|end|>\n")
    assert tiny_tokenizer.convert_ids_to_tokens(stop_token_id(fmt, tiny_tokenizer)) == "<|end|>"


@pytest.fixture(scope="module")
def smol_tokenizer():
    return AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF)


def test_template_format_matches_the_model_template(smol_tokenizer):
    tok = smol_tokenizer
    fmt = chat_format_for(tok)
    assert fmt.kind == "template"
    ours = fmt.render_prefix("Q?", None) + "A1" + fmt.render_observation("O1").replace("Observation: O1", "Observation: O1")
    # The stop token itself is sampled by the actor; the rest is rendered by polyturn.
    stop = tok.decode([stop_token_id(fmt, tok)])
    ours = fmt.render_prefix("Q?", None) + "A1" + stop + fmt.render_observation("O1")
    theirs = tok.apply_chat_template(
        [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A1"},
         {"role": "user", "content": "Observation: O1"}],
        tokenize=False, add_generation_prompt=True,
    )
    assert ours == theirs
    assert stop == "<|im_end|>"
