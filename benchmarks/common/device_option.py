"""The ``--device`` option of the GPU scripts (``benchmarks/bench_gpu.py``, ``benchmarks/triton_probe.py``), read and
checked in one place so that both refuse the same values with the same messages."""

from __future__ import annotations

import argparse

import torch


def parse_device_option(parser: argparse.ArgumentParser, text: str, cpu_hint: str) -> torch.device:
    """``--device``'s value ``text`` as a ``torch.device`` of type cuda or cpu. Anything else stops the script through
    ``parser.error`` (exit status 2, the message naming the option): a string torch cannot read, another device type,
    or cuda where torch sees no CUDA device, whose message ends with ``cpu_hint``, how to run the script on the CPU
    instead (each script's CPU mode differs)."""
    try:
        device = torch.device(text)
    except RuntimeError as err:
        parser.error(f"--device: {err}")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device: cuda or cpu, got {text!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda: no CUDA device is visible; {cpu_hint}")
    return device
