"""What the benchmark and example scripts share, in one place (not shipped with bcos_plugins).

- ``settings``: the ``env_*`` readers of the scripts' environment variables (a bad value stops the run, naming
  the variable, the value and the fix);
- ``ioi_recipe``: the small GPT-2 trained until it solves held-out IOI (its settings, data, training and cache),
  evaluated by ``benchmarks/bench_decoders.py`` and dissected by ``examples/ioi_circuit.py``;
- ``decoder_baselines``: the compact GPT-2 vocabulary and the Captum baselines of contrastive next-token
  explanations (``examples/blimp_mrr.py``, ``benchmarks/bench_decoders.py``);
- ``paired_timing``: speed ratios in paired rounds (each callable once per round in a fresh seeded order, a ratio
  the median of the per-round ratios with its quartiles; ``benchmarks/bench_core.py``);
- ``paired_report``: results files of several seeds paired against a baseline model (``examples/guided_esnli.py
  --report``).
- ``device_option``: the GPU scripts' ``--device`` option read and checked (``benchmarks/bench_gpu.py``,
  ``benchmarks/triton_probe.py``).

A script run as ``python examples/<name>.py`` has its own folder, not the repository root, on ``sys.path``;
each script that imports this package puts the root there first (one line at its imports).
"""
