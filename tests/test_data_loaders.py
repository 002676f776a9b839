"""The shipped text-classification slices and their loaders: sizes, arguments, and files of your own."""

from __future__ import annotations


def test_text_classification_loaders_refuse_bad_arguments_and_bad_lines(tmp_path):
    import pytest

    from bcos_plugins.data import load_ag_news, load_sst2
    from bcos_plugins.errors import BcosFileError, BcosTypeError, BcosValueError

    assert len(load_sst2("test")) == 600 and len(load_ag_news("test")) == 800
    assert load_sst2("train", n=0) == [] and len(load_sst2("train", n=5)) == 5
    with pytest.raises(BcosValueError, match=r"split: the shipped sst2 slice has \['train', 'test'\], got 'validation'"):
        load_sst2("validation")
    with pytest.raises(BcosValueError, match=r"^n: must be >= 0, got -1\. Pass the number of rows to keep, an int >= 0 "
                                             r"\(None keeps all\)\.$"):
        load_sst2(n=-1)  # rows[:-1] would silently drop the last row
    with pytest.raises(BcosTypeError, match=r"^n: must be an int, got float 2\.5\. Pass the number of rows to keep, an "
                                            r"int >= 0 \(None keeps all\)\.$"):
        load_ag_news(n=2.5)
    with pytest.raises(BcosFileError, match="path: .*missing.tsv not found"):
        load_sst2(path=tmp_path / "missing.tsv")
    bad_label = tmp_path / "bad.tsv"
    bad_label.write_text("sentence\tlabel\na fine film\t1\na dull film\t2\n", encoding="utf-8")
    with pytest.raises(BcosValueError, match=r"bad.tsv, line 3: label '2' is not 0 or 1"):
        load_sst2(path=bad_label)
    no_tab = tmp_path / "no_tab.tsv"
    no_tab.write_text("a fine film 1\n", encoding="utf-8")
    with pytest.raises(BcosValueError, match=r"no_tab.tsv, line 1: no tab between text and label"):
        load_ag_news(path=no_tab)
    own = tmp_path / "own.tsv"
    own.write_text("sentence\tlabel\na fine film\t1\n", encoding="utf-8")
    assert load_sst2(path=own) == [("a fine film", 1)]
