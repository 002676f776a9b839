"""Session 26's review (helper-204): what the reviewer found in the session's own commits, each test failing before
its fix."""

from __future__ import annotations

import warnings

import torch

from tests.test_trust_pass25_vision_newcomer import _tiny_vit


def test_the_twice_scaled_images_warning_points_at_the_users_line():
    # ba039a4's warning was raised with stacklevel=2 from encode_image, which the model calls through its InputEncoding
    # module: it pointed at bcos_plugins/vision/encoding.py (the module's forward), not at the user's call, unlike the
    # package's other warnings (caller_stacklevel)
    model = _tiny_vit()
    images = torch.randint(0, 256, (2, 3, 8, 8)) / 255 / 255
    for call in (lambda: model(images), lambda: model.encode(images)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        twice = [w for w in caught if "scaled to [0, 1] twice" in str(w.message)]
        assert len(twice) == 1
        assert twice[0].filename == __file__, twice[0].filename
