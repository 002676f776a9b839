"""examples/ioi_circuit.py's functions on a tiny random B-cos GPT-2 (the full run is `make ioi-circuit`)."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from bcos_plugins import bcosify
from bcos_plugins.data.ioi import _gpt2_tokenizer


@pytest.fixture(scope="module")
def circuit():
    from examples import ioi_circuit

    return ioi_circuit


@pytest.fixture(scope="module")
def setup(circuit):
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf

    tok = _gpt2_tokenizer()
    # a compact vocabulary as the example's model has: the ids of a few prompts, renumbered
    raw = circuit.circuit_prompts(24, 0, tok, lambda ids: ids, tok.eos_token_id)
    used = torch.unique(torch.cat([raw.clean.flatten(), raw.corrupted.flatten()]))
    lookup = torch.full((int(used.max()) + 1,), -1, dtype=torch.long)
    lookup[used] = torch.arange(len(used))
    eos = int(lookup[tok.eos_token_id])  # GPT-2's BOS = EOS, renumbered
    data = circuit.circuit_prompts(24, 0, tok, lambda ids: lookup[ids], eos)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(used), n_embd=32, n_layer=2, n_head=4, n_positions=32, n_ctx=32,
                        bos_token_id=eos, eos_token_id=eos)
    hf = bcosify(GPT2LMHeadModel(config), b=1.1, verbose=False).eval()
    return circuit, tok, used, data, hf, hooked_transformer_from_hf(hf).eval()


def test_prompts_align_clean_and_corrupted(setup):
    _, tok, used, data, _, _ = setup
    assert data.clean.shape == data.corrupted.shape and len(data.prompts) == data.clean.shape[0] >= 12
    assert (data.clean[:, 0] == data.clean[0, 0]).all()  # BOS
    for i, p in enumerate(data.prompts):
        differ = (data.clean[i] != data.corrupted[i]).nonzero().flatten().tolist()
        # the three name slots (shifted by the BOS) and nothing else
        assert differ == sorted(1 + x for x in (*p.evidence_positions, *p.s_positions))
        assert tok.decode(used[data.clean[i, 1:]]) == p.text
        assert used[data.io[i]] == p.target_id and used[data.s[i]] == p.foil_id


def test_direct_contributions_sum_to_the_logit_difference(setup):
    circuit, _, _, data, hf, lens = setup
    heads, info = circuit.head_direct_contributions(lens, data.clean, data.io, data.s)
    assert heads.shape == (2, 4)
    with torch.no_grad():
        expected = circuit.logit_difference(hf(data.clean).logits, data.io, data.s)
    assert info["logit_difference"] == pytest.approx(float(expected), abs=1e-4)
    assert info["completeness_abs_error"] < 1e-4
    rest = sum(info["components"].values())
    assert float(heads.sum()) + rest == pytest.approx(info["logit_difference"], abs=1e-4)
    assert {"embed", "pos_embed"} <= set(info["components"])


def test_patching_is_normalised_and_shaped(setup):
    circuit, _, _, data, _, lens = setup
    effect, info = circuit.head_patching(lens, data)
    assert effect.shape == (2, 4) and torch.isfinite(effect).all()
    assert info["clean_logit_difference"] != info["corrupted_logit_difference"]
    same = circuit.CircuitPrompts(data.clean, data.clean, data.io, data.s, data.prompts)
    with pytest.raises(ValueError, match="patching is undefined"):
        circuit.head_patching(lens, same)


def test_rankings_and_agreement(setup):
    circuit = setup[0]
    scores = torch.tensor([[0.1, 0.9], [-0.5, 0.3]])
    assert circuit.top_heads(scores, k=3) == [("L0H1", pytest.approx(0.9)), ("L1H1", pytest.approx(0.3)),
                                              ("L0H0", pytest.approx(0.1))]
    assert circuit.spearman(scores, scores * 2 + 1) == pytest.approx(1.0)
    assert circuit.spearman(scores, -scores) == pytest.approx(-1.0)


def test_heatmaps_and_html_are_written(setup, tmp_path):
    circuit, tok, used, data, hf, _ = setup
    png = tmp_path / "heads.png"
    circuit.plot_heatmaps(torch.randn(2, 4), torch.randn(2, 4), png, 0.5)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = tmp_path / "tokens.html"
    readable = circuit.ModelVocabularyTokens(tok, used)
    error = circuit.token_contributions_html(hf, data, readable, html, rows=3)
    page = html.read_text()
    assert error < 1e-4 and page.count('class="row"') == 3
    assert data.prompts[0].io in page and "Friends" in page
