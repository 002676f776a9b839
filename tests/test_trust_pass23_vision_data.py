"""Trust pass 23, vision, data and the corpus (helper-163): unusual inputs to the token and image renderings, the
rationale dataset readers and the image metrics. Each case that was silently wrong or crashed unhelpfully, one test
each: refused naming the argument, the problem and the fix (or, where the answer can be right, checked against an
independent computation)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bcos_plugins.errors import BcosTypeError

# ------------------------------------------------------------------ token pages (bcos_plugins/visualize.py)


@pytest.mark.parametrize("scores", [[True, False], np.array([True, False]), ["1", "0.5"]],
                         ids=["bool list", "bool array", "strings"])
def test_tokens_to_html_refuses_boolean_and_text_scores_given_as_a_list_or_array(scores):
    """A boolean tensor was refused as scores, but the same mask as a list or a NumPy array drew as scores 1 and 0
    (float() reads True as 1), and strings were read as numbers: a page of a mask, not of an explanation, silently."""
    from bcos_plugins.visualize import tokens_to_html

    with pytest.raises(BcosTypeError, match=r"^scores: must be (one )?real numbers?.*Pass"):
        tokens_to_html(["a", "b"], scores)


def test_tokens_to_html_reads_a_numpy_row_as_its_tensor():
    """A float array is drawn as the same tensor's row; a 2-D array is refused naming its shape (it was "must be
    numbers")."""
    from bcos_plugins.visualize import tokens_to_html

    row = np.array([0.25, -1.0, 1e-5])
    assert tokens_to_html(["a", "b", "c"], row) == tokens_to_html(["a", "b", "c"], torch.tensor(row))
    assert tokens_to_html(["a", "b", "c"], row) == tokens_to_html(["a", "b", "c"], row.tolist())
    with pytest.raises(BcosTypeError, match=r"^scores: must be one score per token \(1-D\), got shape \(1, 3\)"):
        tokens_to_html(["a", "b", "c"], row[None])


def test_token_pages_name_a_caption_or_title_that_is_not_text():
    """A caption or title of another type failed inside html.escape: "'int' object has no attribute 'replace'"."""
    from bcos_plugins.visualize import _page, tokens_to_html

    with pytest.raises(BcosTypeError, match=r"^caption: must be a str, got int 5\. Pass the text"):
        tokens_to_html(["a"], [1.0], caption=5)
    with pytest.raises(BcosTypeError, match=r"^title: must be a str, got int 7\. Pass the text"):
        _page(7, "")


# ------------------------------------------------------------------ image figures (bcos_plugins/vision/visualize.py)


@pytest.mark.parametrize("shape", [(4, 4, 4), (8, 8), (8, 8, 2), (16, 8, 4)])
def test_explanation_figure_refuses_a_colour_row_of_another_size_than_its_image(tmp_path, shape):
    """The maps were checked against their image's size, the colour rows were not: imshow stretched a 4x4 W(x) row
    (another image's) over the 8x8 image's panel and saved the figure without a word."""
    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.vision.visualize import save_explanation_figure

    images, maps = torch.rand(2, 3, 8, 8), torch.randn(2, 8, 8)
    rows = [np.zeros((8, 8, 4)), np.zeros(shape)]
    with pytest.raises(BcosValueError, match=r"^colour_rows\[1\]: has shape .*; image 1 needs an \(H, W, 4\) colour "
                                             r"image of its size \(8, 8\)\. Pass weight_colour_image"):
        save_explanation_figure(tmp_path / "f.png", images, {"W(x)x": maps}, colour_rows=rows)
    assert not (tmp_path / "f.png").exists()
    save_explanation_figure(tmp_path / "ok.png", images, {"W(x)x": maps}, colour_rows=[np.zeros((8, 8, 4))] * 2)


def test_explanation_figure_refuses_one_string_of_row_titles(tmp_path):
    """row_titles="ab" for two images titled the rows "a" and "b" (its length matched), silently."""
    from bcos_plugins.vision.visualize import save_explanation_figure

    with pytest.raises(BcosTypeError, match=r"^row_titles: got one string \('ab'\); each character would title a row"):
        save_explanation_figure(tmp_path / "f.png", torch.rand(2, 1, 8, 8), {"m": torch.randn(2, 8, 8)},
                                row_titles="ab")


# ------------------------------------------------------------------ text classification loaders (bcos_plugins/data)


def test_load_ag_news_reads_a_file_with_a_byte_order_mark_as_without(tmp_path):
    """AG News files have no header line, so a byte order mark (Windows editors write one) stayed at the start of the
    first text, "\\ufeffWall St. falls", and was tokenised as its own token, silently."""
    from bcos_plugins.data import load_ag_news

    marked, plain = tmp_path / "marked.tsv", tmp_path / "plain.tsv"
    marked.write_text("\ufeffWall St. falls\t2\nGame on\tSports\n", encoding="utf-8")
    plain.write_text("Wall St. falls\t2\nGame on\tSports\n", encoding="utf-8")
    assert list(load_ag_news(path=marked)) == list(load_ag_news(path=plain)) == [("Wall St. falls", 2), ("Game on", 1)]


def test_load_ag_news_drops_empty_texts_as_load_sst2_does(tmp_path):
    """load_sst2 drops empty sentences with a warning; load_ag_news kept them (also a text of the source's line-break
    escapes alone, which cleans to ""): a row of special tokens alone, classified and explained beside the real ones."""
    from bcos_plugins.data import load_ag_news

    file = tmp_path / "ag.tsv"
    file.write_text("\t1\nok\t1\n\\\\\t0\nfine\tWorld\n", encoding="utf-8")
    with pytest.warns(UserWarning, match=r"^load_ag_news: dropped 2 of 4 rows whose text is empty"):
        assert list(load_ag_news(path=file)) == [("ok", 1), ("fine", 0)]
    with pytest.warns(UserWarning, match=r"dropped 2 of 4"):
        assert list(load_ag_news(path=file, n=1)) == [("ok", 1)]


@pytest.mark.parametrize("loader", ["load_sst2", "load_ag_news"])
def test_text_loaders_name_a_file_that_is_not_utf8_or_a_path_of_the_wrong_type(tmp_path, loader):
    """A Latin-1 or UTF-16 file failed with a bare UnicodeDecodeError (no file, no fix), and path=5 or a bytes path
    inside pathlib ("expected str, bytes or os.PathLike object")."""
    import bcos_plugins.data as data
    from bcos_plugins.errors import BcosValueError

    load = getattr(data, loader)
    latin = tmp_path / "latin.tsv"
    latin.write_bytes(b"sentence\tlabel\ngo\xe9d\t1\n")
    with pytest.raises(BcosValueError, match=r"^path: .*latin\.tsv is not UTF-8 text \(byte 17: .*Save the file as "
                                             r"UTF-8"):
        load(path=latin)
    wide = tmp_path / "wide.tsv"
    wide.write_bytes("sentence\tlabel\ngood\t1\n".encode("utf-16"))
    with pytest.raises(BcosValueError, match=r"^path: .*wide\.tsv is not UTF-8 text"):
        load(path=wide)
    for path in (5, b"train.tsv"):
        with pytest.raises(BcosTypeError, match=r"^path: must be a file path \(str or pathlib\.Path\), got "):
            load(path=path)


def test_load_blimp_and_load_ioi_name_a_path_of_the_wrong_type():
    """path=5 failed inside pathlib with "expected str, bytes or os.PathLike object, not int" (no argument named),
    as in load_sst2 / load_ag_news: the one check, data.shipped.data_file."""
    from transformers import GPT2TokenizerFast

    from bcos_plugins.data import load_blimp, load_ioi, shipped_data

    with pytest.raises(BcosTypeError, match=r"^path: must be a file path \(str or pathlib\.Path\), got int 5"):
        load_blimp("anaphor_gender_agreement", path=5)
    tokenizer = GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))
    with pytest.raises(BcosTypeError, match=r"^path: must be a file path \(str or pathlib\.Path\), got int 5"):
        load_ioi(path=5, tokenizer=tokenizer)


# ------------------------------------------------------------------ rationale datasets (bcos_plugins/guided/masks.py)


@pytest.mark.parametrize("entry, shown", [(2, "int 2"), (float("nan"), "float nan"), ("1", "str '1'"), (0.5, "float 0.5")])
def test_hatexplain_word_rationale_refuses_highlights_that_are_not_0_or_1(entry, shown):
    """Each annotator's highlight is 0 or 1: a 2 averaged with another annotator's 0 gave 1.0, a full highlight that
    passed every later check (silently), and a "1" failed inside sum with "unsupported operand type(s)"."""
    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.guided import hatexplain_word_rationale

    record = {"post_id": "p1", "post_tokens": ["a", "b", "c"], "rationales": [[0, 1, 0], [entry, 0, 0]]}
    with pytest.raises(BcosValueError, match=rf"^record: post p1: annotator 1's rationale holds {shown} at word 0; "
                                             r"HateXplain highlights are 0 or 1\. Pass an unmodified HateXplain record"):
        hatexplain_word_rationale(record)
    record["rationales"][1][0] = 1
    assert hatexplain_word_rationale(record) == [0.5, 0.5, 0.0]
    record["rationales"] = [[True, False, True]]
    assert hatexplain_word_rationale(record) == [1.0, 0.0, 1.0]


# ------------------------------------------------------------------ loading a ViT (bcos_plugins/vision/loading.py)


def _saved_vit(tmp_path):
    from bcos_plugins.vision import BcosViT, BcosViTConfig

    torch.manual_seed(0)
    model = BcosViT(BcosViTConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, num_labels=4, conv_channels=[4])).eval()
    model.save_pretrained(tmp_path)
    return model


@pytest.mark.parametrize("key, value", [("logit_scale", 5.0), ("layer_norm_eps", 0.5)])
def test_a_vit_load_refuses_a_keyword_that_makes_another_model_of_the_saved_weights(tmp_path, key, value):
    """from_pretrained(folder, logit_scale=5.0) (or load_bcos_model's) loaded the saved weights into another model:
    every logit 5x the saved model's, or every norm another (logits 0.27 apart on these images), silently, since the
    weights fit. The saved value itself, and no keyword, load the model as saved."""
    from bcos_plugins import load_bcos_model
    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.vision import BcosViT

    model = _saved_vit(tmp_path)
    images = torch.rand(2, 1, 8, 8)
    with pytest.raises(BcosValueError, match=rf"^{key}: from_pretrained\(\.\.\., {key}={value}\) loads the saved weights "
                                             rf"into another model: they were saved with {key}=.*Leave {key} out"):
        BcosViT.from_pretrained(tmp_path, **{key: value})
    # load_bcos_model refuses the keyword itself, by its one check of config keywords (helper-172)
    with pytest.raises(BcosValueError, match=rf"^{key}: is {value}, but .* was saved with {key}=.*: the saved weights "
                                             "would load into another model"):
        load_bcos_model(tmp_path, **{key: value})
    for loaded in (BcosViT.from_pretrained(tmp_path, **{key: getattr(model.config, key)}), load_bcos_model(tmp_path)):
        assert torch.equal(loaded.eval()(pixel_values=images).logits, model(pixel_values=images).logits)


def test_a_vit_load_names_the_shape_keyword_whose_weights_do_not_fit(tmp_path):
    """BcosViT.from_pretrained(folder, max_out=1) failed with transformers' "You set `ignore_mismatched_sizes` to
    `False`, thus raising an error", which named neither the keyword nor the fix."""
    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.vision import BcosViT

    _saved_vit(tmp_path)
    with pytest.raises(BcosValueError, match=r"^path: .* holds weights of other shapes than the BcosViT these keywords "
                                             r"build: \['max_out'\] .*Leave the shape keywords out"):
        BcosViT.from_pretrained(tmp_path, max_out=1)


# ------------------------------------------------------------------ flags of the data helpers


def test_the_data_helpers_refuse_flags_that_are_not_true_or_false():
    """A truthy string read as True: DigitImages(scaled_up_only="no") scaled every view up (another dataset, silently),
    load_ag_news(clean="no") cleaned, and make_grids(strict="False") refused a shortage with the fix "or
    strict=False"; clean=None did not clean. Refused as every other flag of the package (require_bool)."""
    from bcos_plugins.data import load_ag_news
    from bcos_plugins.vision.data import DigitImages, load_digits_split, make_grids

    images, labels, test_images, test_labels = load_digits_split()
    with pytest.raises(BcosTypeError, match=r"^scaled_up_only: must be True or False, got str 'no'"):
        DigitImages(images[:4], labels[:4], scaled_up_only="no")
    with pytest.raises(BcosTypeError, match=r"^strict: must be True or False, got str 'False'"):
        make_grids(test_images[:40], test_labels[:40], torch.rand(40), 100, strict="False")
    for clean in ("no", None):
        with pytest.raises(BcosTypeError, match=r"^clean: must be True or False, got "):
            load_ag_news("test", n=1, clean=clean)
    grids, cells = make_grids(test_images[:40], test_labels[:40], torch.rand(40), 100, strict=False)
    assert 0 < len(grids) < 100 and cells.shape == (len(grids), 4)


def test_token_pages_refuse_one_string_of_captions(minilm_bcos_bert):
    """captions="ab" for two rows captioned them "a" and "b" (its length matched), silently, as row_titles did."""
    from bcos_plugins import explain
    from bcos_plugins.visualize import explanation_sections_to_html, explanations_to_html

    model, tokenizer, batch = minilm_bcos_bert
    explanation = explain(model, batch["input_ids"], batch["attention_mask"])
    with pytest.raises(BcosTypeError, match=r"^captions: got one string \('ab'\); each character would caption a row"):
        explanations_to_html(explanation, tokenizer, captions="ab")
    with pytest.raises(BcosTypeError, match=r"^captions: got one string"):
        explanation_sections_to_html([("h", explanation, "ab")], tokenizer)
    assert "first · explained" in explanations_to_html(explanation, tokenizer, captions=["first", "second"])


def test_explanation_figure_names_an_image_explanation_given_as_a_column():
    """An ImageExplanation given as a column was refused as "has no maps for 2 images"; the fix names its maps."""
    from bcos_plugins.vision import BcosViT, BcosViTConfig, explain_image
    from bcos_plugins.vision.visualize import save_explanation_figure

    torch.manual_seed(0)
    model = BcosViT(BcosViTConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, num_labels=4, conv_channels=[4])).eval()
    images = torch.rand(2, 1, 8, 8)
    explanation = explain_image(model, images)
    with pytest.raises(BcosTypeError, match=r"^columns\['W\(x\)x'\]: is an explanation \(ImageExplanation\), not its maps\. Pass its "
                                            r"per-pixel maps: \{'W\(x\)x': explanation\.contributions\}"):
        save_explanation_figure("unused.png", images, {"W(x)x": explanation})


def test_contribution_map_takes_one_real_map_and_clips_it_at_its_own_percentile():
    """contribution_map((n, H, W)) clipped every map of the batch at one v (a map of small values drew near white beside
    one of large values; the paper clips each map at its own), and a boolean mask drew as contributions 0 and 1."""
    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.vision.visualize import contribution_map

    maps = torch.stack([torch.randn(8, 8) * 1e-3, torch.randn(8, 8) * 10])
    with pytest.raises(BcosValueError, match=r"^contributions: must have 2 dimensions \(H, W\), got shape \(2, 8, 8\)"):
        contribution_map(maps)
    with pytest.raises(BcosTypeError, match=r"^contributions: is a boolean tensor, not contributions\. Pass"):
        contribution_map(maps[0] > 0)
    for m in maps:  # each at its own 99.9th percentile of |values|, symmetric around 0
        clipped, v = contribution_map(m)
        assert v == pytest.approx(float(np.percentile(m.abs().double().numpy(), 99.9)))
        assert clipped.min() >= -v and clipped.max() <= v


# ------------------------------------------------------------------ image inputs (bcos_plugins/vision/encoding.py)


@pytest.mark.parametrize("given, configured, fix", [
    (4, 3, r"RGBA\? drop the alpha channel: pixel_values\[:, :3\]"),
    (3, 1, r"RGB\? convert to grey, e\.g\. pixel_values\.mean\(dim=1, keepdim=True\)"),
    (1, 3, r"grey\? repeat it: pixel_values\.expand\(-1, 3, -1, -1\)")])
def test_vit_inputs_of_rgba_rgb_or_grey_for_another_channel_count_are_named_with_their_conversion(given, configured, fix):
    """An RGBA image for an RGB model (or RGB for grey, grey for RGB) was refused naming only the configured channel
    count; the refusal now says which conversion reads it right. The conversion itself runs."""
    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.vision import BcosViT, BcosViTConfig

    torch.manual_seed(0)
    model = BcosViT(BcosViTConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, num_labels=4, conv_channels=[4], num_channels=configured)).eval()
    images = torch.rand(2, given, 8, 8)
    with pytest.raises(BcosValueError, match=rf"^pixel_values: must have shape \(batch, {configured}, 8, 8\); got "
                                             rf"\(2, {given}, 8, 8\) \(the model was configured with "
                                             rf"num_channels={configured}; {fix}\)"):
        model(pixel_values=images)
    converted = {4: lambda: images[:, :3], 3: lambda: images.mean(dim=1, keepdim=True),
                 1: lambda: images.expand(-1, 3, -1, -1)}[given]()
    assert model(pixel_values=converted).logits.shape == (2, 4)


def test_gold_mask_from_spans_names_spans_past_an_uncut_text_as_misaligned_not_truncated():
    """Spans that start past the text's end of a row nothing was cut from (offsets measured in another text) were
    refused as "truncation cut off" with the fix "Tokenise with a larger max_length", which changes nothing. A row that
    truncation did cut is still refused as before."""
    from transformers import AutoTokenizer

    from bcos_plugins.errors import BcosValueError
    from bcos_plugins.guided import gold_mask_from_spans
    from bcos_plugins.pretrained import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    whole = tokenizer(["Hello world x", "a b"], return_offsets_mapping=True, padding=True, truncation=True,
                      max_length=16)
    with pytest.raises(BcosValueError, match=r"^spans: row 1: \[\(50, 60\)\] for 3 characters: the spans start past "
                                             r"the segment's last encoded character and nothing was truncated.*"
                                             r"Measure the spans in the text that was tokenised"):
        gold_mask_from_spans(whole, [[(6, 11)], [(50, 60)]])
    cut = tokenizer(["Hello world x", "a b c d e f g h"], return_offsets_mapping=True, padding=True, truncation=True,
                    max_length=5)
    with pytest.raises(BcosValueError, match=r"^spans: rows \[1\] mark only text that truncation cut off"):
        gold_mask_from_spans(cut, [[(6, 11)], [(12, 13)]])
    assert gold_mask_from_spans(whole, [[(6, 11)], [(0, 1)]]).tolist() == [[0, 0, 1, 0, 0], [0, 1, 0, 0, 0]]


# ------------------------------------------------------------------ image metrics (bcos_plugins/metrics/image.py)


def test_image_metrics_refuse_a_boolean_mask_as_attribution_maps():
    """A boolean mask was read as maps of 1 and 0: the pointing game shared it out and the ranking broke its ties at
    random, silently (the text metrics refuse boolean scores); its float() is still taken as scores."""
    from bcos_plugins.metrics.image import grid_pointing_game, pixel_perturbation, pixel_ranking

    torch.manual_seed(0)
    mask = torch.rand(2, 8, 8) > 0.5
    with pytest.raises(BcosTypeError, match=r"^attributions: are a boolean tensor, not attribution maps\. Pass"):
        grid_pointing_game(mask, 0)
    with pytest.raises(BcosTypeError, match=r"^attributions: are a boolean tensor"):
        pixel_ranking(mask)
    with pytest.raises(BcosTypeError, match=r"^attributions: are a boolean tensor"):
        pixel_perturbation(lambda x: x.flatten(1)[:, :3], torch.rand(2, 1, 8, 8), mask, 0)
    shares = grid_pointing_game(mask.float(), 0)
    expected = mask[:, :4, :4].flatten(1).sum(1) / mask.flatten(1).sum(1)
    assert torch.allclose(shares, expected.float())
