"""The blocked inference product of ``nn.functional`` (``_blocked_product_``): a large CPU output of an inference
B-cos linear layer (B = 1.25, 1.5 or 2) has its scale passes run one block of rows at a time into a block-sized
scratch tensor and its product written into the matrix product's output, instead of an output-sized fresh tensor (a
speed change: a fresh tensor of megabytes costs a CPU its page faults). These tests hold it to the whole-tensor path
bit for bit (float32, float64 and bfloat16, row lengths that are not a multiple of a vector's width, blocks that do
not divide the rows, zero rows), check that it allocates no output-sized temporary, and that small outputs, ``pow``
exponents, float16 and a ``lin`` the caller did not hand over keep the whole-tensor path."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bcos_plugins.nn import functional as bcos_functional
from bcos_plugins.nn.functional import inference_linear, input_norm, reuse_unit_weights

VIEWS = {"t", "permute", "transpose", "view", "_unsafe_view", "expand", "as_strided", "detach", "alias", "slice",
         "select", "unsqueeze", "reshape", "_reshape_alias"}


class _Allocations(TorchDispatchMode):
    """Each op's name and the element count of the fresh tensor it returned (0 for views, in-place and out= ops)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        fresh = not (name in VIEWS or name.endswith("_") or "out" in kwargs) and isinstance(out, torch.Tensor)
        self.ops.append((name, out.numel() if fresh else 0))
        return out


def _call(x, w, b, *, blocked: bool, block_bytes: int, monkeypatch, mode: str = "no_grad",
          reuse: bool = False, columns: bool = False) -> tuple[torch.Tensor, list[tuple[str, int]]]:
    monkeypatch.setattr(bcos_functional, "_BLOCKED_PRODUCT_BYTES", 1 if blocked else 1 << 62)
    monkeypatch.setattr(bcos_functional, "_PRODUCT_BLOCK_BYTES", block_bytes)
    context = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
    with context, (reuse_unit_weights() if reuse else torch.no_grad()), _Allocations() as seen:
        out = inference_linear(x, w, b, units_are_columns=columns)
    return out, seen.ops


SHAPES = [((16, 64), 384, 1536), ((7, 33), 50, 1537), ((3, 100), 17, 999), ((200,), 8, 131), ((5,), 9, 7),
          ((), 12, 33)]


@pytest.mark.parametrize("b", [1.25, 1.5, 2.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("path", ["plain", "plain_inference_mode", "weight_cache", "columns"])
def test_blocked_product_gives_the_whole_tensor_paths_bits(b, dtype, path, monkeypatch):
    generator = torch.Generator().manual_seed(0)
    mode = "inference_mode" if path == "plain_inference_mode" else "no_grad"
    for lead, features, units in SHAPES:
        x = (torch.randn(*lead, features, generator=generator) * 3).to(dtype)
        if x.dim() > 1:
            x[0] = 0.0  # a zero row: output 0, not NaN
        w = torch.randn(*((features, units) if path == "columns" else (units, features)), generator=generator)
        w = w.to(dtype)
        for block_bytes in (1, 5000, 1 << 30):  # a row a block, blocks that leave a short last one, one block
            options = dict(mode=mode, reuse=path == "weight_cache", columns=path == "columns")
            whole, _ = _call(x, w, b, blocked=False, block_bytes=block_bytes, monkeypatch=monkeypatch, **options)
            blocked, ops = _call(x.clone(), w, b, blocked=True, block_bytes=block_bytes, monkeypatch=monkeypatch,
                                 **options)
            assert ("abs", 0) in ops  # (abs into the scratch: the blocked path ran)
            assert blocked.dtype == whole.dtype and torch.equal(blocked, whole), (lead, features, units, block_bytes)
            if x.dim() > 1:
                assert blocked[0].abs().max() == 0.0


@pytest.mark.parametrize("b", [1.25, 1.5, 2.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_large_output_allocates_no_output_sized_temporary(b, dtype, monkeypatch):
    # MiniLM's intermediate projection at bench_core's shape (16 x 64 tokens, 384 -> 1536) at the default thresholds:
    # the matrix product's output is the one output-sized tensor (the whole-tensor path also made |lin| afresh)
    monkeypatch.setattr(bcos_functional, "_LAST_INPUT", type(bcos_functional._LAST_INPUT)())
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(16, 64, 384, generator=generator, dtype=dtype)
    w = torch.randn(1536, 384, generator=generator, dtype=dtype)
    with torch.no_grad(), _Allocations() as seen:
        out = inference_linear(x, w, b)
    fresh = sorted((count, name) for name, count in seen.ops if count)
    assert fresh[-1] == (out.numel(), "mm")
    assert fresh[-2] == (1536 * 384, "div")  # the unit weight
    rows = {torch.float32: 171, torch.float64: 86}[dtype]  # 1024 rows in 6 (12) blocks of about 1 MB
    assert [count for name, count in seen.ops if name == "empty"] == [rows * 1536]  # the scratch, one per call
    monkeypatch.setattr(bcos_functional, "_BLOCKED_PRODUCT_BYTES", 1 << 62)
    with torch.no_grad():
        assert torch.equal(out, inference_linear(x, w, b))


@pytest.mark.parametrize(("b", "dtype", "numel"), [
    (1.5, torch.float32, 4 * 32 * 256),  # a family shape's largest output (bench_core: 4 x 32 tokens, 128 -> 256)
    (1.1, torch.float32, 16 * 64 * 1536),  # pow: the vector loop and its scalar tail may round differently
    (2.5, torch.float64, 16 * 64 * 1536),
    (1.5, torch.float16, 16 * 64 * 1536),  # float16 widens to float32 for the scale
])
def test_small_outputs_pow_and_float16_keep_the_whole_tensor_path(b, dtype, numel, monkeypatch):
    generator = torch.Generator().manual_seed(2)
    units = 256 if numel < 1 << 20 else 1536
    x = torch.randn(numel // units, 128, generator=generator).to(dtype)
    w = torch.randn(units, 128, generator=generator).to(dtype)
    with torch.no_grad(), _Allocations() as seen:
        inference_linear(x, w, b)
    names = [name for name, _ in seen.ops]
    assert "slice" not in names
    assert ("abs", numel) in seen.ops or ("_to_copy", numel) in seen.ops  # |lin| (float16: its float32 copy) afresh


def test_the_product_does_not_write_a_lin_it_was_not_handed(monkeypatch):
    # _inference_product is also the inference product of bcos_product (MaxOut layers, convolutions, the value
    # projection of the query/key modules), whose lin the caller may read again: written only with overwrite_lin
    monkeypatch.setattr(bcos_functional, "_BLOCKED_PRODUCT_BYTES", 1)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(64, 32, generator=generator)
    lin = torch.randn(64, 300, generator=generator)
    kept = lin.clone()
    with torch.no_grad():
        norm = input_norm(x)
        out = bcos_functional._inference_product(lin, norm, 1.5)
        assert torch.equal(lin, kept) and out.data_ptr() != lin.data_ptr()
        handed = bcos_functional._inference_product(lin, norm, 1.5, overwrite_lin=True)
    assert handed.data_ptr() == lin.data_ptr()
    assert torch.equal(handed, out)


def test_vmap_over_a_large_inference_layer_keeps_the_whole_tensor_path():
    # torch.func.vmap has no batching rule for abs.out (the blocks' kernel): its wrapped tensors take the old path
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(2, 1024, 384, generator=generator)
    w = torch.randn(1536, 384, generator=generator)
    with torch.no_grad():
        alone = torch.stack([inference_linear(row, w, 1.5) for row in x])
        mapped = torch.func.vmap(lambda row: inference_linear(row, w, 1.5))(x)
    assert torch.equal(mapped, alone)
