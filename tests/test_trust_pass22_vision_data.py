"""Trust pass 22 (second wave), vision, data and corpus: unusual inputs to the ViTs, the digit data, the BLiMP
encoder and explain_dataset. Each case that was silently wrong or crashed unhelpfully, one test each: refused
naming the argument, the problem and the fix (or, where the answer can be right, checked against an independent
computation)."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T

from bcos_plugins import bcosify, explain
from bcos_plugins.data import encode_blimp, load_blimp, shipped_data
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.vision import BcosViTConfig, ConventionalViT
from bcos_plugins.vision.data import DigitImages, load_digits_split, make_grids


@pytest.fixture(scope="module")
def gpt2():
    tokenizer = T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))
    tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(0)
    config = T.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=64)
    return bcosify(T.GPT2LMHeadModel(config).eval(), b=1.5, verbose=False), tokenizer


# ------------------------------------------------------------------ vision


def test_conventional_vit_with_one_label_refuses_labels_whose_cross_entropy_is_always_zero():
    """Softmax cross-entropy over one class is 0 for every input (log 1): a ConventionalViT with num_labels=1 given
    labels returned loss 0 with no gradient and trained nothing, silently (BcosViT's bcos_loss refuses one logit)."""
    torch.manual_seed(0)
    model = ConventionalViT(BcosViTConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=32, num_labels=1))
    images = torch.rand(3, 1, 8, 8)
    with pytest.raises(BcosValueError, match=r"labels.*num_labels=1.*always 0.*num_labels=2"):
        model(images, labels=torch.zeros(3, dtype=torch.long))
    assert model(images).logits.shape == (3, 1)  # without labels it still predicts


def test_digit_data_refuse_seeds_that_are_no_whole_number_naming_seed():
    """load_digits_split refused a float or negative seed by name; DigitImages failed inside torch ('manual_seed
    expected a long') and took -1, make_grids failed inside NumPy ('SeedSequence expects int')."""
    images, labels, test_images, test_labels = load_digits_split()
    for bad in (1.5, -1, True):
        with pytest.raises((BcosTypeError, BcosValueError), match=r"^seed: "):
            DigitImages(images[:10], labels[:10], seed=bad)
        with pytest.raises((BcosTypeError, BcosValueError), match=r"^seed: "):
            make_grids(test_images, test_labels, torch.rand(len(test_labels)), 2, seed=bad)
    # the same seed still gives the same rows
    a, b = DigitImages(images[:10], labels[:10], seed=3), DigitImages(images[:10], labels[:10], seed=3)
    assert torch.equal(a.pixel_values, b.pixel_values)


# ------------------------------------------------------------------ BLiMP encoder


def test_encode_blimp_validates_its_arguments_by_name():
    """encode_blimp wrote pad_token_id=-1 into the batch (an embedding lookup failed on it later) and 1.5 as 1,
    failed inside torch on bos_token_id='x' ('too many dimensions'), iterated one BlimpPair ('not iterable'), and
    refused an empty list with a plain ValueError naming no argument."""
    tokenizer = T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))
    pairs = load_blimp("ana", n=3)
    for bad in (-1, 1.5):
        with pytest.raises((BcosTypeError, BcosValueError), match=r"^pad_token_id: "):
            encode_blimp(pairs, tokenizer, pad_token_id=bad)
    with pytest.raises(BcosTypeError, match=r"^bos_token_id: "):
        encode_blimp(pairs, tokenizer, bos_token_id="x")
    with pytest.raises(BcosTypeError, match=r"^pairs: .*BlimpPair"):
        encode_blimp(pairs[0], tokenizer)
    with pytest.raises(BcosValueError, match=r"^pairs: .*empty"):
        encode_blimp([], tokenizer)
    batch = encode_blimp(pairs, tokenizer, pad_token_id=0, bos_token_id=tokenizer.eos_token_id)
    assert (batch.input_ids[:, -1] != 0).all() and len(batch) == 3


# ------------------------------------------------------------------ explain_dataset


def test_explain_dataset_refuses_a_max_length_the_special_tokens_fill(minilm_bcos_bert):
    """max_length=1 on a BERT tokenizer (which adds [CLS] and [SEP]) was ignored by the tokenizer (it logs and
    returns the whole text): every text was explained untruncated and marked not truncated, and a text longer than
    the model's positions failed inside the model. max_length=2 left [CLS] [SEP] alone: nothing of the text."""
    pytest.importorskip("datasets")
    from bcos_plugins import explain_dataset

    model, tokenizer, _ = minilm_bcos_bert
    for max_length in (1, 2):
        with pytest.raises(BcosValueError, match=r"^max_length: .*special tokens.*max_length=3"):
            explain_dataset(model, tokenizer, ["a gorgeous, witty film", "dull"], max_length=max_length,
                            progress=False)
    with pytest.warns(UserWarning, match=r"text\(s\) \[0\] have more than max_length=3 tokens"):
        out = explain_dataset(model, tokenizer, ["a gorgeous, witty film", "dull"], max_length=3, progress=False)
    assert [len(t) for t in out["tokens"]] == [3, 3] and out["truncated"] == [True, False]


def test_explain_dataset_keeps_a_column_named_like_the_renamed_one(minilm_bcos_bert):
    """A dataset with both 'scores' and 'original_scores' failed inside datasets ('duplicated columns'): the clash
    renamed 'scores' to a name the dataset already had."""
    datasets = pytest.importorskip("datasets")
    from bcos_plugins import explain_dataset

    model, tokenizer, _ = minilm_bcos_bert
    data = datasets.Dataset.from_dict({"text": ["good", "dull"], "scores": [1, 2], "original_scores": [3, 4]})
    out = explain_dataset(model, tokenizer, data, progress=False)
    assert out["original_scores"] == [3, 4] and out["original_original_scores"] == [1, 2]
    enc = tokenizer(["good"], return_tensors="pt")
    assert out["scores"][0] == pytest.approx(explain(model, enc["input_ids"]).scores()[0].tolist(), abs=1e-6)


def test_explain_dataset_says_which_tokens_a_left_truncating_tokenizer_kept(gpt2):
    """With truncation_side='left' the tokenizer keeps a text's last max_length tokens; the warning said each text
    was explained as 'the first tokens', which it was not."""
    pytest.importorskip("datasets")
    from bcos_plugins import explain_dataset

    model, tokenizer = gpt2
    tokenizer.truncation_side = "left"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = explain_dataset(model, tokenizer, ["a b c d e f"], max_length=2, target=5, progress=False)
    finally:
        tokenizer.truncation_side = "right"
    assert out["tokens"] == [["Ġe", "Ġf"]] and out["truncated"] == [True]
    texts = [str(w.message) for w in caught if "max_length" in str(w.message)]
    assert len(texts) == 1 and "the last tokens the tokenizer kept (its last 2" in texts[0]
    assert "first" not in texts[0]


def test_explanation_figure_refuses_a_map_of_another_size_than_its_image(tmp_path):
    """attention_rollout spread with the wrong patch_size (3 for a model of patch 4) gives a 6x6 map of an 8x8
    image; save_explanation_figure drew it stretched over the image's panel as if it were the image's pixels."""
    from bcos_plugins.vision import BcosViT
    from bcos_plugins.vision.rollout import attention_rollout
    from bcos_plugins.vision.visualize import save_explanation_figure

    torch.manual_seed(0)
    model = BcosViT(BcosViTConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32, num_labels=3)).eval()
    images = torch.rand(2, 1, 8, 8)
    attentions = model(images, output_attentions=True).attentions
    wrong = attention_rollout(attentions, 3)
    assert wrong.shape == (2, 6, 6)
    with pytest.raises(BcosValueError, match=r"columns\['rollout'\]\[0\]: has shape \(6, 6\) .*\(8, 8\).*patch_size"):
        save_explanation_figure(tmp_path / "f.png", images, {"rollout": wrong})
    assert save_explanation_figure(tmp_path / "g.png", images, {"rollout": attention_rollout(attentions, 4)}).exists()


def test_encoded_texts_refuse_a_max_length_the_special_tokens_fill(minilm_bcos_bert):
    """EncodedTexts (the training helpers' dataset) with max_length=1 kept the whole text (the tokenizer ignores a
    max_length below its special tokens), with 2 a row of [CLS] [SEP] trained on as the text, with 3 for pairs rows
    of special tokens alone; explain_dataset's check (_checks.require_max_length_beyond_special_tokens)."""
    from bcos_plugins.encoded_texts import EncodedTexts

    _, tokenizer, _ = minilm_bcos_bert
    for max_length in (1, 2):
        with pytest.raises(BcosValueError, match=r"^max_length: .*2 special tokens.*max_length=3"):
            EncodedTexts(tokenizer, ["a gorgeous witty film", "dull"], [0, 1], max_length)
    with pytest.raises(BcosValueError, match=r"^max_length: .*3 special tokens to each pair.*max_length=5"):
        EncodedTexts(tokenizer, ["a gorgeous witty film", "dull"], [0, 1], 4, text_pairs=["b c", "e"])
    rows = EncodedTexts(tokenizer, ["a gorgeous witty film", "dull"], [0, 1], 3).encodings["input_ids"]
    assert [tokenizer.convert_ids_to_tokens(r) for r in rows] == [["[CLS]", "a", "[SEP]"], ["[CLS]", "dull", "[SEP]"]]


def test_load_ag_news_names_a_header_line_its_files_do_not_have(tmp_path):
    """load_ag_news reads files without a header; one with 'text<TAB>label' was refused as 'unknown AG News label
    'label'' with labels as the fix, where the cause was the header line."""
    from bcos_plugins.data import load_ag_news

    path = tmp_path / "ag.tsv"
    path.write_text("text\tlabel\nStocks rose\tBusiness\n", encoding="utf-8")
    with pytest.raises(BcosValueError, match=r"line 1: unknown AG News label 'label' \(a header line\? .*drop it\)"):
        load_ag_news(path=path)
    path.write_text("Stocks rose\tBusiness\nThe team won\t1\n", encoding="utf-8")
    data = load_ag_news(path=path)
    assert data.texts == ["Stocks rose", "The team won"] and data.labels == [2, 1]


def test_load_ioi_names_a_missing_field_a_bad_line_and_a_folder(tmp_path):
    """load_ioi failed with KeyError('ioi_sentences') on rows without the column, AttributeError on a null sentence,
    json's decode error on a line that is no JSON and IsADirectoryError on a folder; each named nothing."""
    import json

    from bcos_plugins.data import load_ioi

    tokenizer = T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))
    good = "Then, Tom and Anna had fun. Anna gave a ring to Tom"
    path = tmp_path / "ioi.jsonl"
    path.write_text(json.dumps({"sentence": good}) + "\n", encoding="utf-8")
    with pytest.raises(BcosValueError, match=r"^column: .*line 1 has no field 'ioi_sentences' \(it holds \['sentence'\]"):
        load_ioi(path, tokenizer=tokenizer)
    assert load_ioi(path, column="sentence", tokenizer=tokenizer)[0].io == "Tom"
    path.write_text(json.dumps({"ioi_sentences": None}) + "\n" + json.dumps({"ioi_sentences": good}) + "\n",
                    encoding="utf-8")
    prompts = load_ioi(path, tokenizer=tokenizer)  # the null row is skipped, as any unusable row
    assert [(p.io, p.s) for p in prompts] == [("Tom", "Anna")]
    path.write_text("{not json\n", encoding="utf-8")
    with pytest.raises(BcosValueError, match=r"^path: .*line 1 is not JSON"):
        load_ioi(path, tokenizer=tokenizer)
    with pytest.raises(FileNotFoundError, match=r"^path: .*is not a file"):
        load_ioi(tmp_path, tokenizer=tokenizer)


def test_vit_from_pretrained_refuses_a_b_its_checkpoint_overrides(tmp_path):
    """BcosViT.from_pretrained(folder, b=2.0) of a model saved at b=1.5 set config.b to 2.0 while every layer ran at
    the B stored in the checkpoint (1.5): the config said one B and the explanations came from another, silently."""
    from bcos_plugins.vision import BcosViT

    torch.manual_seed(0)
    model = BcosViT(BcosViTConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32, num_labels=3, b=1.5)).eval()
    model.save_pretrained(tmp_path)
    with pytest.raises(BcosValueError, match=r"^b: from_pretrained\(\.\.\., b=2\.0\) does not change .*\[1\.5\]"):
        BcosViT.from_pretrained(tmp_path, b=2.0)
    images = torch.rand(2, 1, 8, 8)
    same = BcosViT.from_pretrained(tmp_path, b=1.5).eval()  # the stored B: loads as saved
    assert same.config.b == 1.5 and torch.equal(same(images).logits, model(images).logits)
