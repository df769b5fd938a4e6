"""Syncs inside Hugging Face transformers: each gets transformers' own remedy, and the remedy works.

A model called as its model card shows, ``model(input_ids=..., labels=...)``, syncs in
transformers' forward: BERT looks for padding when no ``attention_mask`` is given and checks
whether its mask is all ones before SDPA; GPT-2 (and Llama) check whether a given padding mask
hides anything. Tiny models are built from their configs (no download) and watched with CPU
tensors counted as device tensors (``include_cpu=True``), as a GPU run would count them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from lightning_speedpack.sync_points.attribution import library_fix
from tests.helpers import global_state
from tests.sync_points.test_detect import _watch

transformers = pytest.importorskip("transformers")

PADDING_FIX = (
    "transformers looks for padding in input_ids on every forward because no attention_mask "
    "was passed (warn_if_padding_and_no_attention_mask reads `pad_token_id in input_ids`): "
    "pass the tokenizer's attention_mask= with the input_ids"
)
ALL_ONES_FIX = (
    "transformers checks on every forward whether the attention mask is all ones "
    "(_prepare_4d_attention_mask_for_sdpa: torch.all(mask == 1)), even a mask it built itself, "
    "to leave it out of SDPA: torch.compile(model) skips the check (the mask is then always "
    "applied); otherwise it is one small sync a forward, worth removing only when steps are short"
)
CAUSAL_FIX = (
    "transformers checks on every forward whether the padding mask hides any token "
    "(_ignore_causal_mask_sdpa: padding_mask.all()), so that SDPA can use is_causal: batches "
    "that are never padded can leave attention_mask=None (no check); otherwise "
    "torch.compile(model) skips it (the mask is then always applied)"
)


@pytest.fixture
def clean_state() -> Iterator[None]:
    before = global_state.snapshot()
    yield
    assert global_state.diff(before, global_state.snapshot()) == {}


def _bert() -> Any:
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=3,
    )
    return transformers.BertForSequenceClassification(config)


def _gpt2() -> Any:
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2)
    return transformers.GPT2LMHeadModel(config)


def _all_fixes(fn: Callable[[], Any]) -> list[tuple[str, str]]:
    """``(kind, fix)`` of each sync inside transformers that ``fn`` makes, the item first.

    Each is placed at ``fn``'s own line: the user's call, not a line inside transformers.
    """
    fn()  # transformers' first call does one-time work (warnings, lazy imports): not a step
    det = _watch(fn, include_cpu=True)
    found = [f for f in det.findings() if f.library == "transformers"]
    call_line = inspect.getsourcelines(fn)[1] + 1  # the line after the def: the model's call
    assert {f.lineno for f in found} <= {call_line}
    fixes = [
        (f.kind, library_fix(f.library, f.kind, f.library_location, f.library_calls)) for f in found
    ]
    return sorted(fixes, key=lambda kind_fix: kind_fix[0] != "item")


IDS = torch.randint(1, 100, (4, 16), generator=torch.Generator().manual_seed(0))
PADDED = torch.ones_like(IDS)
PADDED[0, -3:] = 0  # the first sequence ends in three pad tokens


def test_bert_without_a_mask_is_told_to_pass_the_tokenizers_mask(clean_state: None) -> None:
    torch.manual_seed(0)
    bert, labels = _bert(), torch.tensor([0, 1, 2, 0])

    def step() -> Any:
        return bert(input_ids=IDS, labels=labels)

    assert _all_fixes(step) == [("item", PADDING_FIX), ("bool", ALL_ONES_FIX)]

    def remedied() -> Any:
        return bert(input_ids=IDS, attention_mask=torch.ones_like(IDS), labels=labels)

    # The padding look is gone; the all-ones check stays (its remedy is torch.compile).
    assert _all_fixes(remedied) == [("bool", ALL_ONES_FIX)]
    bert.eval()  # no dropout: the same logits
    torch.testing.assert_close(remedied().logits, step().logits)


def test_gpt2_given_a_mask_is_told_when_to_leave_it_out(clean_state: None) -> None:
    torch.manual_seed(0)
    gpt2 = _gpt2()

    def step() -> Any:
        return gpt2(input_ids=IDS, attention_mask=torch.ones_like(IDS), labels=IDS)

    assert _all_fixes(step) == [("bool", CAUSAL_FIX)]

    def remedied() -> Any:  # batches never padded: no mask, no check
        return gpt2(input_ids=IDS, labels=IDS)

    assert _all_fixes(remedied) == []
    gpt2.eval()  # no dropout: the same logits
    torch.testing.assert_close(remedied().logits, step().logits)

    def padded() -> Any:  # padded batches keep their mask, and with it the check
        return gpt2(input_ids=IDS, attention_mask=PADDED, labels=IDS)

    assert _all_fixes(padded) == [("bool", CAUSAL_FIX)]


def test_other_transformers_syncs_name_the_call_not_every_n_steps() -> None:
    fix = library_fix("transformers", "item", "transformers/x.py:1", ["T5Model.forward", "f"])
    assert fix.startswith("Hugging Face transformers syncs inside T5Model.forward (item) on")
    assert "every N steps" not in fix
    assert library_fix("datasets", "item").startswith("Hugging Face datasets syncs inside")
