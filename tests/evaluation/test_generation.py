"""`recurlen generate` says why it stopped: the end-of-text token, max_new_tokens, or neither."""

import pytest
import torch

from recurlen.evaluation.generation import GenerateConfig, generate_text, greedy_generate, stop_reason


def test_stop_reason_names_the_end_of_text_token_and_the_budget():
    kept, why = stop_reason([5, 6, 7, 0, 0], max_new_tokens=32, eos_id=0)
    assert kept == [5, 6, 7]
    assert why == "stopped: the model emitted the end-of-text token (id 0) after 3 of at most max_new_tokens=32"
    assert stop_reason([5, 6, 7], max_new_tokens=3, eos_id=0) == ([5, 6, 7], "stopped: reached max_new_tokens=3")
    assert stop_reason([5], max_new_tokens=3, eos_id=None)[1] == \
        "stopped after 1 of max_new_tokens=3 without an end-of-text token (the decoder gave no more)"


def test_generation_that_hits_the_end_of_text_token_says_so(monkeypatch):
    from recurlen.models import registry
    from recurlen.util.tokenizers import ByteTokenizer

    # What generate_text's untrained tiny model continues "def main(" with (it seeds torch with 0 the same way).
    torch.manual_seed(0)
    a = registry.get(registry.DEFAULT)
    ids = torch.tensor([ByteTokenizer().encode("def main(")])
    tokens = greedy_generate(a.build(a.preset("tiny")).eval(), ids, max_new_tokens=3)[0].tolist()
    # Make the second token the tokenizer's end-of-text id: generation stops there, well before 32.
    monkeypatch.setattr(ByteTokenizer, "eos_id", tokens[1])
    n = tokens.index(tokens[1])
    text, summary = generate_text(GenerateConfig(model="tiny", max_new_tokens=32))
    assert f"{n} new tokens (stopped: the model emitted the end-of-text token (id {tokens[1]}) after {n} of at most " \
           "max_new_tokens=32)" in summary
    assert text == "def main(" + ByteTokenizer().decode(tokens[:n])


@pytest.mark.parametrize("n", [1, 4])
def test_generation_that_runs_out_of_budget_says_so(n):
    _, summary = generate_text(GenerateConfig(model="tiny", max_new_tokens=n))
    assert f"{n} new tokens (stopped: reached max_new_tokens={n})" in summary
