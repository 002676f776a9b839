"""Trust pass 25, vision, data and a newcomer's first two hours (helper-199): unusual inputs aimed at the B-cos ViT,
Captum's vision wrappers, the renderings, the shipped datasets and their loaders, the README / getting-started
snippets changed one thing at a time and the example scripts' options. Each case that was silently wrong or failed
with a message that did not name the argument, the problem and the fix is pinned here (every test failed before its
fix).

- ``load_sst2("test", source="hub")`` returned GLUE's hidden test labels (-1 on every row) as class ids, and the
  hub's sentences with GLUE's trailing space (a last token of its own for a byte-level tokenizer) where the shipped
  slice's are stripped.
- ``path=`` with ``source="hub"`` (``load_sst2``, ``load_ag_news``, ``load_blimp``) read the hub and ignored the
  file.
- ``examples/bilinear_digits.py --epochs 0`` reported an untrained model's numbers, ``--noise -1`` trained with noise
  of std 1 and ``--mask-strength nan`` drew NaN masks, each without a word; ``examples/bilinear_language.py --k 0``
  (and other out-of-range options) failed inside sae-lens after minutes of training.
- ``examples/inseq_quickstart.py --model ./missing`` failed with transformers' "Repo id must use alphanumeric chars".
- ``BcosAttribution(lambda x: vit(x).logits)`` at a B-cos ViT's pixels warned that part of the output does not come
  from ``inputs`` naming only the text models' fix; a ``forward_func`` returning the ViT's output named
  ``inputs_embeds=``, which a ViT does not take.
- ``explain_image`` of an empty batch was told to add a batch dimension.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from bcos_plugins.errors import BcosTypeError, BcosValueError

ROOT = Path(__file__).resolve().parents[1]


class _HubRows(list):
    """What ``datasets.load_dataset`` returns, as the loaders iterate it."""


def _fake_hub(monkeypatch, rows):
    import datasets

    calls = []

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return _HubRows(rows)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_load_sst2_refuses_glue_s_unlabelled_test_split_naming_split(monkeypatch):
    # GLUE SST-2's test split holds label -1 on every row: it came back as class id -1 beside names [neg, pos]
    from bcos_plugins.data import load_sst2

    calls = _fake_hub(monkeypatch, [{"sentence": "a gorgeous film ", "label": -1, "idx": 0},
                                    {"sentence": "dull ", "label": -1, "idx": 1}])
    with pytest.raises(BcosValueError, match=r"^split: GLUE SST-2's 'test' split has no labels \(2 of 2 rows .*-1.*"
                                             r"split='validation'"):
        load_sst2("test", source="hub")
    assert calls[0][0] == ("glue", "sst2")


def test_load_sst2_from_the_hub_strips_sentences_as_the_shipped_slice_does(monkeypatch):
    # GLUE's sentences end in a space: GPT-2's tokenizer gave it a last token of its own (the one its classifier reads)
    import transformers as T

    from bcos_plugins.data import load_sst2, shipped_data

    _fake_hub(monkeypatch, [{"sentence": "it 's a charming and often affecting journey . ", "label": 1, "idx": 0},
                            {"sentence": "unflinchingly bleak and desperate ", "label": 0, "idx": 1}])
    data = load_sst2("validation", source="hub")
    assert data.texts == ["it 's a charming and often affecting journey .", "unflinchingly bleak and desperate"]
    assert data.labels == [1, 0] and data.label_names == ["negative", "positive"]
    gpt2 = T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))
    assert gpt2.tokenize(data.texts[1])[-1] == "Ġdesperate"


@pytest.mark.parametrize("loader", ["load_sst2", "load_ag_news", "load_blimp"])
def test_a_file_and_the_hub_together_are_refused_naming_path(monkeypatch, tmp_path, loader):
    # the hub was read and the user's file ignored, silently
    import bcos_plugins.data as data

    calls = _fake_hub(monkeypatch, [])
    file = tmp_path / "mine.tsv"
    file.write_text("sentence\tlabel\ngood\t1\n")
    args = ("dna",) if loader == "load_blimp" else ()
    with pytest.raises(BcosValueError, match=rf"^path: {loader} was given path=.*mine\.tsv' and source='hub'.*"
                                             r"Leave source out"):
        getattr(data, loader)(*args, path=file, source="hub")
    assert calls == []


def _run_example(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize(("script", "options", "message"), [
    ("bilinear_digits", ["--epochs", "0"], "argument --epochs: must be >= 1, got 0"),
    ("bilinear_digits", ["--mask-strength", "nan"], "argument --mask-strength: must be a finite number > 0.0, got nan"),
    ("bilinear_language", ["--k", "0"], "argument --k: must be >= 1, got 0"),
    ("bilinear_language", ["--k", "10000"], "--k: must be <= the SAE width expansion * d_model = 512, got 10000"),
], ids=["digits-epochs-0", "digits-mask-nan", "language-k-0", "language-k-wider-than-the-sae"])
def test_the_bilinear_examples_refuse_an_out_of_range_option_before_any_work(tmp_path, script, options, message):
    # bilinear_digits ran each to the end (--epochs 0: an untrained model's eigenvectors and masks, printed and plotted
    # as results); bilinear_language's --k 0 trained the language model for minutes, then failed inside sae-lens
    run = _run_example(f"examples/{script}.py", "--out", str(tmp_path / "out"), *options)
    assert run.returncode == 2, run.stdout[-500:]
    assert message in run.stderr
    assert not (tmp_path / "out").exists()


def test_the_option_types_take_what_is_in_range():
    sys.path.insert(0, str(ROOT))
    from benchmarks.common.settings import option_float, option_int

    assert option_int(1)(" 3 ") == 3 and option_int(0, 5)("5") == 5
    assert option_float(0.0)("0") == 0.0 and option_float(0.0, exclusive_minimum=True)("1e-3") == 1e-3
    # (--noise -1 trained with noise of std 1, --sae-lr 0 trained nothing, --d-hidden x was argparse's own message)
    for read, raw, problem in ((option_int(1), "1.5", "must be a whole number, got '1.5'"),
                               (option_int(0, 5), "6", "must be >= 0 and <= 5, got 6"),
                               (option_float(0.0), "-1", "must be a finite number >= 0.0, got -1"),
                               (option_float(0.0), "inf", "must be a finite number >= 0.0, got inf"),
                               (option_float(0.0, exclusive_minimum=True), "0.0", "must be a finite number > 0.0")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(problem)):
            read(raw)


def test_inseq_quickstart_names_a_model_folder_that_is_not_there(tmp_path):
    # was transformers' "Repo id must use alphanumeric chars, '-', '_' or '.'", read as a hub id
    missing = tmp_path / "my-model"
    run = _run_example("examples/inseq_quickstart.py", "--model", str(missing))
    assert run.returncode == 2
    assert f"--model: no folder '{missing}'" in run.stderr and "save_pretrained" in run.stderr


def _tiny_vit():
    from bcos_plugins.vision import BcosViT, BcosViTConfig

    torch.manual_seed(0)
    return BcosViT(BcosViTConfig(image_size=8, num_channels=3, patch_size=4, hidden_size=8, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=16, tokenizer="conv", conv_channels=[4],
                                 num_labels=4)).eval()


def test_captum_at_a_vits_pixels_names_the_encoding_as_the_fix():
    # BcosAttribution at the pixels misses the encoding's constant (1 - x); the warning named only inputs_embeds=
    from bcos_plugins.adapters.captum import BcosAttribution

    from bcos_plugins.vision import explain_image

    model, images = _tiny_vit(), torch.rand(2, 3, 8, 8)
    with pytest.warns(UserWarning, match=r"B-cos ViT.*encoded_pixel_values=e\).logits\).attribute\(model.encode"):
        BcosAttribution(lambda x: model(x).logits).attribute(images, target=0)
    # the fix it names is complete, and equals explain_image
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attributions = BcosAttribution(lambda e: model(encoded_pixel_values=e).logits).attribute(
            model.encode(images), target=0)
    torch.testing.assert_close(attributions.sum(1), explain_image(model, images, target=0).contributions)
    with pytest.raises(BcosTypeError, match=r"^forward_func: returned a ImageClassifierOutput.*for a B-cos ViT, "
                                            r"lambda e: model\(encoded_pixel_values=e\).logits on model.encode"):
        BcosAttribution(lambda e: model(encoded_pixel_values=e)).attribute(model.encode(images), target=0)


@pytest.mark.parametrize(("shape", "fix"), [((0, 3, 8, 8), "Pass at least one image"),
                                            ((3, 8, 8), r"Add a batch dimension with images\[None\]"),
                                            ((8, 8), r"Add the batch and channel dimensions with images\[None, None\]")])
def test_explain_image_names_the_fix_for_the_shape_it_got(shape, fix):
    # an empty batch was told "Add a batch dimension with images[None]"
    from bcos_plugins.vision import explain_image

    with pytest.raises(BcosValueError, match=rf"^pixel_values: expected a non-empty .* got shape .*\. {fix}\.$"):
        explain_image(_tiny_vit(), torch.rand(shape))


@pytest.mark.parametrize(("images", "fix"), [
    (lambda x, e: x.permute(0, 2, 3, 1), r"Channels last\? Pass images.permute\(0, 3, 1, 2\)"),
    (lambda x, e: e.encoded, r"The \[x, 1 - x\] encoding \(explanation.encoded\)\? Pass the images, encoded\[:, :3\]"),
], ids=["channels-last", "encoded"])
def test_save_explanation_figure_names_channels_last_and_encoded_images(tmp_path, images, fix):
    # both were told "Pass one channel (images[:, :1]) or three": channels-last RGB images as "8 channels"
    from bcos_plugins.vision import explain_image
    from bcos_plugins.vision.visualize import save_explanation_figure

    model, x = _tiny_vit(), torch.rand(2, 3, 8, 8)
    explanation = explain_image(model, x)
    with pytest.raises(BcosValueError, match=rf"^images: has \d channels; .*\. {fix}\.$"):
        save_explanation_figure(tmp_path / "f.png", images(x, explanation), {"W(x)x": explanation.contributions})
    assert list(tmp_path.iterdir()) == []
    # the fix each names draws the figure
    save_explanation_figure(tmp_path / "f.png", x, {"W(x)x": explanation.contributions})


def test_images_scaled_to_0_1_twice_are_named_with_a_warning():
    # 8-bit images divided by 255 twice (ToTensor() then / 255) lie in [0, 1/255]: the model explained almost black
    # images without a word
    from bcos_plugins.vision import explain_image

    model = _tiny_vit()
    eight_bit = torch.randint(0, 256, (2, 3, 8, 8))
    with pytest.warns(UserWarning, match=r"^pixel_values: every value is at most 0\.00\d+ \(<= 1/255\): images scaled "
                                         r"to \[0, 1\] twice.*Divide 8-bit images by 255 once"):
        explain_image(model, eight_bit / 255 / 255)
    with pytest.warns(UserWarning, match="scaled to \\[0, 1\\] twice"):
        model(eight_bit / 255 / 255)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        explanation = explain_image(model, eight_bit / 255)  # scaled once: no warning
        explain_image(model, torch.zeros(1, 3, 8, 8))  # black images are black
    assert float(explanation.completeness_error.max()) < 1e-5


def test_load_ag_news_names_the_original_files_one_based_class_ids(tmp_path):
    # AG News' own files number the classes 1-4: 1-3 read as the ids of the next class, and the first 4 was refused as
    # an unknown label without the cause
    from bcos_plugins.data import load_ag_news

    file = tmp_path / "ag.tsv"
    file.write_text("Wall St. bears claw back\t3\nOil prices rise\t4\n")
    with pytest.raises(BcosValueError, match=r"^path: .*line 2: unknown AG News label '4' \(the original AG News files "
                                             r"number the classes 1-4: subtract 1 from every label\)"):
        load_ag_news(path=file)
    file.write_text("Wall St. bears claw back\t2\nOil prices rise\t3\n")
    assert load_ag_news(path=file).labels == [2, 3]
