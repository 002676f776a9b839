"""The Triton kernel of :mod:`bcos_plugins.nn.triton_linear` (its docstring has the maths), undecorated.

A module of its own so that ``import bcos_plugins`` does not import triton: :func:`~bcos_plugins.nn.triton_linear.decorated_kernel`
imports it on first use and decorates the function with ``triton.jit``, for the compiler or the interpreter.
"""
# (no `from __future__ import annotations`: Triton's interpreter reads the `tl.constexpr` annotations as objects)

try:
    import triton.language as tl
except ImportError:  # (importable without triton, as every module of the package; the switch refuses to turn on)
    tl = None


if tl is not None:
    def bcos_linear_kernel(
        x_ptr, w_ptr, out_ptr, dyn_ptr, x_norm_ptr, w_norm_ptr,
        M, N,
        stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
        exponent,
        # K is a compile-time constant: Triton 3.6's interpreter cannot loop to a runtime bound under NumPy >= 2.4
        # (int() of its one-element arrays; fixed in Triton 3.8), and a layer's d_in is fixed anyway
        K: tl.constexpr,
        B_MODE: tl.constexpr, FLOOR: tl.constexpr, STORE_DYN: tl.constexpr, STORE_NORMS: tl.constexpr,
        DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, INTERPRETED_BF16: tl.constexpr,
        NORM_EPS_: tl.constexpr, COS_FLOOR_: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        LATE_NORMS: tl.constexpr = False, NORMS_FIRST: tl.constexpr = False, UNITS_FASTEST: tl.constexpr = False,
    ):
        if UNITS_FASTEST:
            # (benchmarks/triton_probe.py's "/nfast" configurations; the launch swaps the grid's axes) programs that
            # run together share a block of rows and sweep the units, so x is read from memory about once and the
            # weight, the smaller operand at these shapes, is what L2 serves again
            pid_m = tl.program_id(1)
            pid_n = tl.program_id(0)
        else:
            pid_m = tl.program_id(0)
            pid_n = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        units = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        row_ok = rows < M
        unit_ok = units < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        x_sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
        w_sq = tl.zeros((BLOCK_N,), dtype=tl.float32)
        if LATE_NORMS:
            # (the bfloat16 / float16 default tiles, and benchmarks/triton_probe.py's "/late" configurations) the
            # squares summed element-wise in tiles and reduced once after the loop, instead of a cross-thread
            # reduction of each tile inside it (1.26-1.45x faster per launch in bfloat16 on an H200)
            x_sq_tile = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
            w_sq_tile = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
        if NORMS_FIRST:
            # (benchmarks/triton_probe.py's "/first" configurations) the sums of squares in a K loop of their own,
            # before the product's, which then reads its tiles for the dot alone (no copy of each tile out of shared
            # memory for the squares); the tiles are read twice, the second time mostly from L2
            x_sq_first = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
            w_sq_first = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                k = k0 + ks
                k_ok = k < K
                x_first = tl.load(x_ptr + rows[:, None] * stride_xm + k[None, :] * stride_xk,
                                  mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
                w_first = tl.load(w_ptr + k[:, None] * stride_wk + units[None, :] * stride_wn,
                                  mask=k_ok[:, None] & unit_ok[None, :], other=0.0).to(tl.float32)
                x_sq_first += x_first * x_first
                w_sq_first += w_first * w_first
            x_sq = tl.sum(x_sq_first, axis=1)
            w_sq = tl.sum(w_sq_first, axis=0)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + ks
            k_ok = k < K
            x_tile = tl.load(x_ptr + rows[:, None] * stride_xm + k[None, :] * stride_xk,
                             mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            # w read as (K, N): the product needs no transpose
            w_tile = tl.load(w_ptr + k[:, None] * stride_wk + units[None, :] * stride_wn,
                             mask=k_ok[:, None] & unit_ok[None, :], other=0.0)
            x_wide = x_tile.to(tl.float32)
            w_wide = w_tile.to(tl.float32)
            if NORMS_FIRST:
                pass
            elif LATE_NORMS:
                x_sq_tile += x_wide * x_wide
                w_sq_tile += w_wide * w_wide
            else:
                x_sq += tl.sum(x_wide * x_wide, axis=1)
                w_sq += tl.sum(w_wide * w_wide, axis=0)
            if INTERPRETED_BF16:
                # Triton's interpreter multiplies bfloat16 tiles as their raw 16-bit integers (tests check it still
                # does): the tiles are rounded to bfloat16 values and kept in float32, whose products of bfloat16
                # values are exact, so this gives the bfloat16 dot's values. Rounded by hand: the interpreter's cast
                # to bfloat16 truncates (below)
                bits = x_wide.to(tl.uint32, bitcast=True)
                a = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
                bits = w_wide.to(tl.uint32, bitcast=True)
                b = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
            else:
                a = x_tile.to(DOT_DTYPE)
                b = w_tile.to(DOT_DTYPE)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        if LATE_NORMS and not NORMS_FIRST:
            x_sq = tl.sum(x_sq_tile, axis=1)
            w_sq = tl.sum(w_sq_tile, axis=0)
        w_norm = tl.sqrt(w_sq)
        # a unit whose squared norm passes float32's range made NaN, as the PyTorch path's unit norms are
        # (overflowed_norm_as_nan): its w / inf gave 0 in every row, silently; so that unit's outputs (and the gradients
        # through it) are NaN in every row. The clamps keep the NaN: the default tl.maximum may return the non-NaN
        # operand (max.f32 on a GPU, np.fmax in Triton 3.9's interpreter)
        w_norm = tl.where(w_norm == float("inf"), float("nan"), w_norm)
        w_clamped = tl.maximum(w_norm, NORM_EPS_, propagate_nan=tl.PropagateNan.ALL)
        lin = acc / w_clamped[None, :]
        x_norm = tl.sqrt(x_sq + NORM_EPS_)  # hypot(||x||, sqrt(eps)) of the PyTorch path, from the squared norm
        # a row whose squared norm overflows float32 (||x|| > 1.8e19) made NaN, as overflowed_norm_as_nan does on
        # the PyTorch path: inf gave that row 0 or a wrong finite value, silently; finite norms pass unchanged
        x_norm = tl.where(x_norm == float("inf"), float("nan"), x_norm)
        cos = tl.abs(lin) / x_norm[:, None]
        if FLOOR:
            # NaN kept (an overflowed row's): the default tl.maximum may return the non-NaN operand (PTX's max.f32,
            # and Triton 3.9's interpreter, np.fmax), which made that row's |cos| the floor and its output finite
            cos = tl.maximum(cos, COS_FLOOR_, propagate_nan=tl.PropagateNan.ALL)
        if B_MODE == 2:
            dyn = cos
        elif B_MODE == 1:
            dyn = tl.sqrt(cos)
        elif B_MODE == 3:
            dyn = tl.sqrt(tl.sqrt(cos))
        else:  # (0 where cos is 0: exp2(-inf) = 0, every exponent being positive)
            dyn = tl.exp2(exponent * tl.log2(cos))
        ok = row_ok[:, None] & unit_ok[None, :]
        offsets = rows[:, None] * stride_om + units[None, :] * stride_on
        out = lin * dyn
        if INTERPRETED_BF16:
            # Triton 3.6's interpreter casts float32 to bfloat16 by truncation (toward 0; tests check it still does),
            # the compiled kernel and torch to the nearest: every output rounded toward 0 made the interpreted kernel's
            # bfloat16 values 2-3x further from float64 than the PyTorch path's, and explanations of a tiny Llama 3x
            # less complete. Rounded to the nearest bfloat16 by hand (ties to even; its float32 bits then have 16
            # trailing zeros, so the truncating cast that stores it is exact)
            bits = out.to(tl.uint32, bitcast=True)
            out = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=ok)
        if STORE_DYN:
            # dyn / max(||w||, eps): the explaining backward's factor on the raw weight, (grad * it) @ w, which needs no
            # normalised copy of the weight
            scale = dyn / w_clamped[None, :]
            if INTERPRETED_BF16:  # (to the nearest, as the output above)
                bits = scale.to(tl.uint32, bitcast=True)
                scale = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
            tl.store(dyn_ptr + offsets, scale.to(dyn_ptr.dtype.element_ty), mask=ok)
        if STORE_NORMS:
            # each row's norm once (the first column of programs), each unit's once (the first row of programs); as
            # branches, not as a mask `row_ok & (pid_n == 0)`, whose scalar operand Triton 3.9's interpreter refuses
            if pid_n == 0:
                tl.store(x_norm_ptr + rows, x_norm, mask=row_ok)
            if pid_m == 0:
                tl.store(w_norm_ptr + units, w_norm, mask=unit_ok)
