"""Issue 29, core library: inputs that used to give a silently wrong number or an opaque traceback now give the
right answer or a package error naming the argument, the problem and the fix."""

from __future__ import annotations

import pytest

from bcos_plugins.data import corrupt_ioi, make_ioi_prompts
from bcos_plugins.errors import BcosTypeError, BcosValueError

# ---------------------------------------------------------------- IOI prompts: IO and S are two different names


def test_ioi_names_with_a_repeat_are_refused_before_a_prompt_has_io_equal_to_s():
    # before: rng.sample drew ('Tom', 'Tom') for some prompts: target == foil, logit difference always 0
    with pytest.raises(BcosValueError, match=r"^names: repeats \['Tom'\].*Pass each name once"):
        make_ioi_prompts(6, names=["Tom", "Tom", "Amy"])
    with pytest.raises(BcosTypeError, match="^names: every name must be a non-empty str"):
        make_ioi_prompts(2, names=["Tom", ""])
    prompts = make_ioi_prompts(40, names=["Tom", "Amy", "Ben"])
    assert all(p.io != p.s and p.target_id != p.foil_id for p in prompts)


def test_ioi_template_with_a_literal_name_is_refused():
    # before: "Then, Amy and Tom met Tom. Tom waved to" had the S three times, and with IO = Tom the evidence
    # marked one of the IO's two mentions
    template = "Then, {A} and {B} met Tom. {S} waved to"
    with pytest.raises(BcosValueError, match=r"^templates: .*contains the name\(s\) \['Tom'\]"):
        make_ioi_prompts(4, names=["Tom", "Amy"], templates=[template])
    # the same template with names that do not occur in it is an IOI template
    prompts = make_ioi_prompts(4, names=["Ben", "Amy"], templates=[template])
    for p in prompts:
        assert [p.input_ids.count(p.target_id), p.input_ids.count(p.foil_id)] == [1, 2]
        assert p.input_ids[p.evidence_positions[0]] == p.target_id


def test_ioi_every_generated_prompt_mentions_io_once_and_s_twice():
    # names that are also the shipped objects / places (lower case) would repeat through {OBJECT} / {PLACE}
    with pytest.raises(BcosValueError, match=r"^templates: .*\['ball'\]"):
        make_ioi_prompts(4, names=["ball", "Amy", "Tom"], templates=["Then, {A} and {B} got a {OBJECT}. {S} gave "
                                                                     "it to"])
    for p in make_ioi_prompts(60, split="heldout", seed=3) + make_ioi_prompts(60, seed=5):
        ids = list(p.input_ids)
        assert [i for i, t in enumerate(ids) if t == p.target_id] == list(p.evidence_positions)
        assert [i for i, t in enumerate(ids) if t == p.foil_id] == list(p.s_positions)


def test_ioi_corruption_never_repeats_a_name():
    template = "Then, {A} and {B} met Kim. {S} waved to"
    clean = make_ioi_prompts(6, names=["Ben", "Amy"], templates=[template])
    with pytest.raises(BcosValueError, match="^names: the corrupted text .* mentions one of"):
        corrupt_ioi(clean, names=["Kim", "Joe", "Tim"])
    for p in corrupt_ioi(clean, names=["Lily", "Joe", "Tim", "Max"]):
        assert len({p.input_ids[i] for i in (*p.evidence_positions, *p.s_positions)}) == 3
