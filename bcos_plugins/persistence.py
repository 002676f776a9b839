"""Loading B-cos models saved with ``save_pretrained``, and the checks that make a load exact or refuse it.

A B-cos text model is saved as its stock transformers class would be, plus ``config.bcos`` (the record of
:mod:`bcos_plugins.convert.checkpoint_format`) and one ``bcos_b`` entry per B-cos layer. Loading reads it
with transformers' own ``from_pretrained`` as the stock class, converts it again exactly as it was saved and
refuses anything that would make the loaded model differ from the saved one. A :class:`~bcos_plugins.vision.
BcosViT` folder is loaded as a ``BcosViT`` with the same checks.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ._checks import closest_name, closest_name_fix
from .convert.architectures import SPECS, stock_class
from .convert.bcosify import bcosify
from .convert.checkpoint_format import (
    BCOS_CONFIG_KEY,
    FORMAT_VERSION,
    READABLE_FORMAT_VERSIONS,
    RECORD_ENTRY_TYPES,
    RECORD_KEYS,
    STOCK_QUERY_KEY_FORMAT_VERSION,
)
from .errors import BcosError, BcosFileError, BcosKeywordError, BcosTypeError, BcosValueError, argument_error
from .nn.linear import AlignmentPressure, check_b, recorded_pressure

__all__ = ["BCOS_CONFIG_KEY", "FORMAT_VERSION", "READABLE_FORMAT_VERSIONS", "STOCK_QUERY_KEY_FORMAT_VERSION",
           "load_bcos_model", "reconvert_stock_load"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_VIT_MODEL_TYPE = "bcos_vit"
SINGLE_WEIGHTS = "model.safetensors"
SHARDED_INDEX = "model.safetensors.index.json"


class _LogCapture(logging.Handler):
    """Keeps transformers' loading messages (its load report) to put them into the package's errors."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(_ANSI.sub("", record.getMessage()))

    def problems(self) -> list[str]:
        """The report's rows that are errors (not the biases and ``bcos_b`` entries B-cos expects)."""
        rows = [line for message in self.messages for line in message.splitlines() if "|" in line]
        bad = [" ".join(r.replace("|", " ").split()) for r in rows if "MISMATCH" in r or "CONVERSION" in r]
        return bad or [m for m in self.messages if "LOAD REPORT" not in m][:5]


def checked_folder(path) -> tuple[str, bool]:
    """``path`` as a string and whether it is a local folder; clear errors for what cannot be a model."""
    if not isinstance(path, str | os.PathLike):
        raise argument_error("path", f"must be a folder path (str or Path), got {type(path).__name__}",
                             "pass the folder written by model.save_pretrained(folder)", kind=BcosTypeError)
    text = os.fspath(path)
    local = Path(os.path.expanduser(text))  # os.path leaves "~unknown_user" as it is; pathlib raises
    try:
        is_dir, exists = local.is_dir(), local.exists()
    except (OSError, ValueError) as err:  # a name too long for the file system, a NUL byte, ...
        raise BcosFileError(f"path: {text[:200]!r} cannot be a folder ({err.__class__.__name__}: "
                            f"{str(err)[:120]}). Pass the folder written by model.save_pretrained(folder).") from None
    if is_dir:
        if not (local / "config.json").is_file():
            raise BcosFileError(f"path: {local} has no config.json, so it is not a saved model. Pass the folder "
                                "written by model.save_pretrained(folder).")
        return str(local), True
    if exists:
        raise BcosFileError(f"path: {local} is a file, not a folder. Pass the folder written by "
                            "model.save_pretrained(folder) (it holds config.json and model.safetensors).")
    if not _HUB_ID.match(text) or text.startswith((".", "~")):
        raise BcosFileError(f"path: the folder {local} does not exist. Pass the folder written by "
                            "model.save_pretrained(folder) (or a hub model id such as 'user/model').")
    return text, False


def _variant_name(name: str, variant: str | None) -> str:
    """``name`` with ``variant`` before its last suffix, as transformers names a variant's files
    (``model.safetensors`` -> ``model.fp16.safetensors``, ``model.safetensors.index.json`` ->
    ``model.safetensors.index.fp16.json``)."""
    if variant is None:
        return name
    stem, suffix = name.rsplit(".", 1)
    return f"{stem}.{variant}.{suffix}"


# from_pretrained's options that pick which copy of a hub repository it reads (a revision, a cache folder, the credentials
# to reach it): the config and the weight files (each layer's stored B) are read with them too
_HUB_OPTIONS = ("revision", "cache_dir", "token", "local_files_only", "force_download", "proxies")


def hub_options(kwargs: dict) -> dict:
    """The :data:`_HUB_OPTIONS` among ``kwargs``: ``load_bcos_model(hub_id, revision="v2")`` loaded v2's weights with
    the record and each layer's B of the default revision's files (another model, silently)."""
    return {key: kwargs[key] for key in _HUB_OPTIONS if key in kwargs}


def weight_files(path: str, local: bool, variant: str | None = None, hub: dict | None = None) -> list[str]:
    """The safetensors files transformers loads from ``path``, each checked to be complete (named if not).

    ``hub``: :func:`hub_options` of the load, with which a hub id's files are found (ignored for a local folder).

    ``variant``: ``from_pretrained``'s, which loads ``model.<variant>.safetensors`` (or its sharded index) instead:
    these are the files read then. The B each layer stored was read from ``model.safetensors`` whatever the variant,
    so a folder holding both (``save_pretrained(folder)`` and ``save_pretrained(folder, variant="fp16")`` of two
    models) loaded the variant's weights with the other save's B, another model than either (logits 0.28 off),
    silently; a folder with the variant alone was refused as having no ``model.safetensors``.

    The choice follows transformers' own: a single ``model.safetensors`` wins over a sharded index. An index
    whose shards are gone is left over from an earlier sharded save into the same folder (``save_pretrained``
    removes the shards, not the index) and is not read. A folder holding both whole checkpoints is refused:
    one of them is left over from an earlier save (a sharded save leaves an earlier ``model.safetensors``),
    and transformers would load ``model.safetensors`` even when it is the stale one.
    """
    from safetensors import safe_open
    from transformers.utils import cached_file

    def find(name: str) -> str | None:
        if local:
            candidate = os.path.join(path, name)
            return candidate if os.path.isfile(candidate) else None
        try:
            return cached_file(path, name, _raise_exceptions_for_missing_entries=False, **(hub or {}))
        except OSError:
            return None

    single_name, index_name = _variant_name(SINGLE_WEIGHTS, variant), _variant_name(SHARDED_INDEX, variant)
    single, index = find(single_name), find(index_name)
    if index is not None:
        try:
            with open(index) as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            if single is None:
                raise BcosFileError(f"path: {index} is not a valid safetensors index ({err}). Re-save the model "
                                    "with save_pretrained.") from None
            names = []  # transformers reads model.safetensors and never opens this index
        shards = [find(name) for name in names]
        if single is None:
            files = [shard or os.path.join(os.path.dirname(index), name) for shard, name in zip(shards, names, strict=True)]
        elif names and all(shards):
            newer = single_name if os.path.getmtime(single) >= os.path.getmtime(index) else index_name
            raise BcosFileError(
                f"path: {path} holds two checkpoints, {single_name} and a sharded one ({index_name} with "
                f"{len(names)} shards): one is left over from an earlier save_pretrained into this folder, and "
                f"transformers would load {single_name} even if it is the old one. Delete the files of the "
                f"checkpoint you did not save last ({newer} is the newer by its time stamp), or save into an "
                "empty folder.")
    if single is not None:
        files = [single]
    elif index is None:
        shard_stem = single_name.rsplit(".", 1)[0]  # a variant's shards: model.fp16-00001-of-00002.safetensors
        shards = sorted(p.name for p in Path(path).glob(f"{shard_stem}-*-of-*.safetensors")) if local else []
        if shards:
            # told only that there was no model.safetensors, and to save the model again
            raise BcosFileError(
                f"path: {path} holds {len(shards)} safetensors shard(s) ({', '.join(shards[:3])}"
                f"{', ...' if len(shards) > 3 else ''}) but no {index_name}, which says which weight each shard "
                "holds. Copy the index written by save_pretrained next to the shards too (the whole folder).")
        if variant is not None:
            saved = sorted(p.name for p in Path(path).glob("model*.safetensors")) if local else []
            raise argument_error(
                "variant", f"is {variant!r}, but {path} has no {single_name} (nor {index_name})"
                + (f"; it holds {', '.join(saved[:4])}" if saved else ""),
                "Pass the variant the model was saved with (save_pretrained(folder, variant=...)), or leave variant "
                "out to load model.safetensors", kind=BcosFileError)
        other = [n for n in ("pytorch_model.bin", "model.pt") if find(n)]
        # the config holds config.bcos here: loading the file with transformers and saving it again (the fix it named)
        # drops each layer's stored B and gives the stock biases back, a folder this load then refuses
        hint = f" It holds {other[0]}: {_pickled_weights_fix(os.path.join(path, other[0]), path)}" if other else ""
        raise BcosFileError(f"path: {path} has no model.safetensors (load_bcos_model reads safetensors only)."
                            f"{hint or ' Save the model with model.save_pretrained(folder)'}.")
    for file in files:
        if not os.path.isfile(file):
            raise BcosFileError(f"path: the weight file {file} listed in the index is missing. Copy the whole "
                                "folder written by save_pretrained.")
        if os.path.getsize(file) == 0:
            raise BcosFileError(f"path: the weight file {file} is empty (0 bytes). Save the model again with "
                                "save_pretrained, or copy the file again (the copy was interrupted?).")
        try:
            with safe_open(file, framework="pt"):
                pass
        except Exception as err:  # safetensors raises its own SafetensorError for damaged files
            raise BcosFileError(f"path: the weight file {file} is damaged or truncated ({err}). Save the model "
                                "again with save_pretrained, or copy the file again.") from None
    return files


def _pickled_weights_fix(file: str, folder: str) -> str:
    """How a B-cos state dict saved with ``torch.save`` (``pytorch_model.bin``) becomes a folder :func:`load_bcos_model`
    reads: its tensors written as safetensors as they are, each layer's ``bcos_b`` included. Loading it with
    transformers' ``from_pretrained`` and saving it again, the fix the refusals named, loads the stock class, which drops
    every ``bcos_b`` entry and starts the biases B-cos removed afresh: a folder the load then refuses."""
    return (f"write its tensors as safetensors, each layer's bcos_b entry included: safetensors.torch.save_file("
            f"{{k: v.clone() for k, v in torch.load({file!r}).items()}}, {os.path.join(folder, SINGLE_WEIGHTS)!r}, "
            "metadata={'format': 'pt'}) (loading it with transformers' from_pretrained and saving it again would drop "
            "each layer's B)")


def stored_pressures(files: list[str], keys: set[str] | None = None,
                     recorded_b: float | None = None) -> dict[str, float]:
    """``{layer name: B}`` from the ``bcos_b`` entries of the checkpoint (format 2 and later); every key of the
    checkpoint is added to ``keys`` when it is given (the same reading of the files).

    A B stored in float32 (a save on MPS, which has no float64) that is ``recorded_b`` (``config.bcos['b']``) rounded
    to float32 is read as ``recorded_b`` (:func:`~bcos_plugins.nn.linear.recorded_pressure`, the rule of the layers'
    own loading too): the layer ran with that B, and its float32 rounding (1.100000023841858 for 1.1) loaded every
    layer at another B, with a warning that they differed from ``config.bcos['b']`` "= 1.1"."""
    from safetensors import safe_open

    out = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for key in f.keys():
                if keys is not None:
                    keys.add(key)
                if key.endswith(".bcos_b"):
                    recorded = () if recorded_b is None else (recorded_b,)
                    out[key[: -len(".bcos_b")]] = recorded_pressure(f.get_tensor(key), *recorded)
    return out


def checked_settings(path: str, config) -> dict:
    """``config.bcos`` of a saved B-cos model, refused (with the field named) if it was edited or is unknown."""
    settings = getattr(config, BCOS_CONFIG_KEY, None)
    if not isinstance(settings, dict) or "architecture" not in settings:
        raise BcosValueError(f"path: {path} has no B-cos settings in config.json (config.bcos); it was not "
                             "saved from a model converted with bcosify. Load it with transformers and call "
                             "bcosify instead.")
    unknown = sorted(map(str, set(settings) - set(RECORD_KEYS)))
    if unknown:
        # a misspelt key (norm_epss) was read as a record not written: its check did not run, silently
        close = next(filter(None, (closest_name(key, RECORD_KEYS) for key in unknown)), None)
        raise BcosValueError(
            f"config.bcos: {path}/config.json holds the key(s) {', '.join(map(repr, unknown))}, which no version of "
            f"bcos-plugins writes (it writes {', '.join(map(repr, RECORD_KEYS))}), so the record would not be read as "
            f"written. config.json was edited{f' (did you mean {close!r}?)' if close else ''}: restore it from the "
            "original save (the file is not rewritten), or upgrade bcos-plugins if a newer one saved the model.")
    _refuse_mistyped_entries(path, settings)
    version = settings.get("format_version")
    if isinstance(version, bool) or version not in READABLE_FORMAT_VERSIONS:
        raise BcosValueError(
            f"config.bcos['format_version']: {path}/config.json says {version!r}, but this version of "
            f"bcos-plugins reads formats {', '.join(map(str, READABLE_FORMAT_VERSIONS))}. Upgrade bcos-plugins "
            "if the model was saved by a newer one; otherwise config.json was edited: restore it from the "
            "original save (the file is not rewritten)."
        )
    check_b(settings.get("b"), name="config.bcos['b']")
    expected = "stock" if version == STOCK_QUERY_KEY_FORMAT_VERSION else None
    if settings.get("query_key") != expected:
        raise BcosValueError(
            f"config.bcos['query_key']: {path}/config.json says {settings.get('query_key')!r} with format "
            f"{version}, which writes {expected!r}. config.json was edited: restore it from the original save "
            "(the file is not rewritten).")
    name = settings["architecture"]
    if not isinstance(name, str) or name not in SPECS:
        raise BcosValueError(f"config.bcos['architecture']: {path}/config.json names {name!r}, not one of "
                             f"{', '.join(sorted(SPECS))}. Restore config.json from the original save.")
    # save_pretrained writes the class it saved into config.architectures (the B-cos subclass bcosify swaps in
    # for some, e.g. BcosDistilBertForSequenceClassification), and the config's own class (model_type) must be
    # the one the architecture reads: either differing means config.json was edited
    saved = getattr(config, "architectures", None)
    config_class = stock_class(name).config_class
    if (saved and list(saved) not in ([name], [f"Bcos{name}"])) or not isinstance(config, config_class):
        raise BcosValueError(
            f"config.bcos['architecture']: {path}/config.json names {name!r}, but the file describes "
            f"{'architectures ' + str(list(saved)) if saved else ''}{' and ' if saved else ''}model_type "
            f"{getattr(config, 'model_type', None)!r} ({name} reads {config_class.__name__}). config.json was "
            "edited: restore it from the original save (the file is not rewritten).")
    return settings


def _refuse_mistyped_entries(path: str, settings: dict) -> None:
    """Refuse a per-module record (``config.bcos['norm_eps']`` ...) that is not ``{module path: value}`` with values
    of the type bcosify writes: an edited ``"1e-12"`` was compared with the rebuilt 1e-12 and refused as "saved as
    1e-12, rebuilt as 1e-12", a message that names no difference."""
    for key, types in RECORD_ENTRY_TYPES.items():
        if key not in settings:
            continue
        entries = settings[key]
        wanted = " or ".join(t.__name__ for t in types)
        example = "a JSON number, 1e-12, not the text \"1e-12\"" if key == "norm_eps" else "a JSON string"
        if not isinstance(entries, dict):
            raise BcosValueError(
                f"config.bcos['{key}']: {path}/config.json holds a {type(entries).__name__} ({entries!r}), where "
                f"bcosify writes {{module path: {wanted}}}. config.json was edited: restore it from the original save "
                "(the file is not rewritten).")
        for module_path, value in entries.items():
            if isinstance(value, bool) or not isinstance(value, types):
                raise BcosValueError(
                    f"config.bcos['{key}']['{module_path}']: {path}/config.json holds {type(value).__name__} "
                    f"{value!r}, where bcosify writes a {wanted}. config.json was edited: write it as {example}, or "
                    "restore config.json from the original save (the file is not rewritten).")


def _refuse_rebuilt_otherwise(path: str, key: str, saved, rebuilt: dict, what: str, absent: str,
                              loaded: Callable[[str], bool]) -> None:
    """Refuse a load whose conversion rebuilt ``config.bcos[key]`` (``{module path: activation or norm epsilon}``,
    written by bcosify) otherwise than the save recorded it: an activation or epsilon set by hand on the model before
    bcosify, which save_pretrained does not write (only the config's), or an edited config.json (a keyword of the load
    that changes it is refused before, by _apply_config_overrides).
    ``absent`` names what a path missing from one side held. Only paths whose module ``loaded`` says the load rebuilt
    from saved weights count: one of a layer that a keyword added or removed (``num_hidden_layers``) is a mismatch of
    the weights, which the load's weight check names (it was reported here as an activation rebuilt otherwise)."""
    if not isinstance(saved, dict):
        saved = {"(record)": repr(saved)}  # not written by bcosify: reported as differing below
    if saved == rebuilt:
        return
    differing = sorted(p for p in set(saved) | set(rebuilt)
                       if saved.get(p) != rebuilt.get(p) and (p == "(record)" or loaded(p)))
    if not differing:
        return
    shown = "; ".join(f"'{p}' saved as {saved.get(p) or absent}, rebuilt as {rebuilt.get(p) or absent}"
                      for p in differing[:3])
    setting = "epsilon" if key == "norm_eps" else "activation"
    raise BcosValueError(
        f"config.bcos['{key}']: {path} was saved with {what} that its config does not rebuild ({len(differing)} "
        f"differ: {shown}{'; ...' if len(differing) > 3 else ''}): {'an' if setting == 'activation' else 'a norm'} "
        f"{setting} set by hand on the model before bcosify (or Swish_beta gates still annealing after it: finish with "
        f"bcos_plugins.bilinear.finalize_bilinear), which save_pretrained does not write (only the config's "
        f"{setting}), or a config.json edited. Loading it would give "
        f"another model. Build the model with the {setting} in its config ("
        + ("hidden_act / hidden_activation / activation_function" if setting == "activation" else
           "layer_norm_eps / rms_norm_eps / norm_eps") + ") before bcosify and save again, or restore config.json "
        "from the original save.")


def refuse_weights_from_elsewhere(model: nn.Module, path: str, files: list[str]) -> None:
    """Refuse a stock model (loaded from a B-cos save by plain transformers) whose weights are not the ones ``files``
    hold, the files of ``path`` each layer's stored B is read from: a model loaded with ``subfolder``, ``variant`` or
    ``revision`` names only ``path`` (``config._name_or_path``), so the inseq adapter converted a checkpoint-500 or an
    fp16 variant at the top folder's B (a tiny GPT-2's logits 0.033 off), silently. The first row of each saved tensor
    is compared with the model's, cast as the load casts it: read from the memory-mapped file alone, it costs next to
    nothing (whole tensors: 0.6-0.8 of the load's own time, docs/benchmarks.md, 2026-11-29 07:54 UTC), and a trained
    weight of another save differs there (a save's own weights are equal everywhere)."""
    from safetensors import safe_open

    state = model.state_dict()
    for file in files:
        with safe_open(file, framework="pt") as saved:
            for key in saved.keys():  # noqa: SIM118 - safe_open is no mapping
                held = state.get(key)
                # offloaded (meta) and quantised weights hold no values to compare: the conversion refuses them, naming
                # the cause (device_map, the quantised layer's class)
                if held is None or key.endswith(".bcos_b") or held.is_meta or not held.is_floating_point():
                    continue
                first = saved.get_slice(key)[:1] if held.ndim else saved.get_tensor(key)
                if not torch.equal(first.to(device=held.device, dtype=held.dtype), held[:1] if held.ndim else held):
                    raise argument_error(
                        "model", f"its weight '{key}' is not the one saved in {file}, the file of {path} (its "
                        "config._name_or_path) that each layer's B is read from: it was loaded from other files (a "
                        "subfolder, a variant, a revision) or changed after loading, and converting it at those B would "
                        "give another model", "Load it with bcos_plugins.load_bcos_model(path, subfolder=..., "
                        "variant=...), which reads the weights and each layer's B from the same files, and pass that "
                        "model", kind=BcosValueError)


def reconvert_stock_load(model: nn.Module, path: str, settings: dict | None = None,
                         files: list[str] | None = None) -> tuple[dict[str, nn.Module], list[str]]:
    """Convert, in place, a model transformers loaded as its *stock* class from a B-cos save at ``path``.

    Converts it as it was saved: the query/key choice recorded in ``config.bcos`` and, from format 2, the B
    every B-cos layer stored (a save made mid-way through a B warm-up has several). The one mechanism behind
    :func:`load_bcos_model` and the inseq adapter's ``inseq.load_model(folder, "bcos")``. Returns the B-cos
    layers by name and the names of those the save stored no B for (the caller decides whether that is an
    error). ``settings`` / ``files`` skip re-reading them when the caller already has them.

    Raises:
        BcosValueError: a format-1 record (one B in ``config.bcos["b"]``) next to weights that store a B per
            layer, i.e. an edited ``format_version`` whose load would ignore the stored B; weights holding a bias
            the recorded conversion drops (a stock model's, or a save whose record was edited).
    """
    if settings is None:
        settings = checked_settings(path, model.config)
    if files is None:
        files = weight_files(*checked_folder(path))
    saved_keys: set[str] = set()
    stored = stored_pressures(files, saved_keys, recorded_b=settings["b"])
    if settings["format_version"] < 2 and stored:
        # format 1 never wrote bcos_b entries: these weights come from a later save whose config.json was edited
        raise BcosValueError(
            f"config.bcos['format_version']: {path}/config.json says 1 (one B for every layer, "
            f"config.bcos['b'] = {settings['b']}), but its weights store a B per layer ({len(stored)} bcos_b "
            "entries, written from format 2 on), which format 1 would ignore. config.json was edited: restore "
            "it from the original save (the file is not rewritten).")
    # the record is read (settings) and written again by bcosify, which refuses a stock model that still holds one
    delattr(model.config, BCOS_CONFIG_KEY)
    bcosify(model, b=settings["b"], bcos_query_key=settings.get("query_key") != "stock", verbose=False)
    # a save of a B-cos model holds none of the biases its conversion drops (they were gone when it was saved): the
    # stock class loads them without a word and bcosify then drops them, so weights of another model (a stock save
    # given a config.bcos record; a bcos_query_key=False GPT-2, whose c_attn keeps its bias, with the record's
    # format_version and query_key edited) loaded as a different model, silently (logits 0.12 off)
    rebuilt = getattr(model.config, BCOS_CONFIG_KEY)

    def loaded(module_path: str) -> bool:
        """Whether the module at ``module_path`` is in the model and its parent's weights were loaded from the save."""
        try:
            model.get_submodule(module_path)
        except AttributeError:
            return False
        parent = module_path.rpartition(".")[0]
        return not parent or any(key.startswith(parent + ".") for key in saved_keys)

    # a gated MLP's activation set by hand before bcosify (no config name, or not the config's): save_pretrained
    # writes only the config's name, so the reload held another activation, silently (logits off)
    _refuse_rebuilt_otherwise(path, "gate_branch_activations", settings.get("gate_branch_activations", {}),
                              rebuilt.get("gate_branch_activations", {}), "gated-MLP activations",
                              "one with a gate kind", loaded)
    if "activations" in settings:  # recorded after 0.2.0: an older save cannot be checked (nothing to compare)
        _refuse_rebuilt_otherwise(path, "activations", settings["activations"], rebuilt.get("activations", {}),
                                  "activations (gate kinds)", "no detachable activation", loaded)
    if "norm_eps" in settings:  # recorded after 0.2.0, as the activations
        _refuse_rebuilt_otherwise(path, "norm_eps", settings["norm_eps"], rebuilt.get("norm_eps", {}),
                                  "norm epsilons", "no norm", loaded)
    held = sorted(set(model.bcos_report.dropped_biases) & saved_keys)
    if held:
        raise BcosValueError(
            f"path: {path} holds {len(held)} bias(es) that the B-cos {settings['architecture']} its config.bcos "
            f"describes has no place for ({', '.join(held[:4])}{', ...' if len(held) > 4 else ''}): a save of that "
            "model holds none, so these weights come from another model (a stock one, one converted with other "
            "settings: config.json was edited, or one given a module with a bias after bcosify, e.g. a new nn.Linear "
            "head). Restore config.json from the original save, or load the stock model with transformers and call "
            "bcosify; for a new head, put a B-cos layer there (bcos_plugins.nn.BcosLinear.from_linear(layer, "
            "b=model.config.bcos['b'])) and save again.")
    layers = {n: m for n, m in model.named_modules() if isinstance(m, AlignmentPressure)}
    without_b = sorted(set(layers) - set(stored)) if settings["format_version"] >= 2 else []
    for layer_name, value in stored.items():
        if layer_name in layers:
            layers[layer_name].b = check_b(value, name=f"{layer_name}.bcos_b in {path}")
    other = sorted({layer.b for layer in layers.values() if layer.b != settings["b"]})
    if other:
        # the stored B wins (the loaded model is the saved one), but config.bcos['b'] is what BWarmupCallback anneals
        # towards and what a reader takes for the model's B: a B edited there by hand was ignored without a word
        n_other = sum(layer.b != settings["b"] for layer in layers.values())
        warnings.warn(
            f"load: {n_other} of the {len(layers)} B-cos layers in {path} run at the B stored with them "
            f"({', '.join(f'{b:g}' for b in other[:4])}{', ...' if len(other) > 4 else ''}), not at "
            f"config.bcos['b'] = {settings['b']:g}: a save made during a B warm-up (config.bcos['b'] is its target) "
            "or a config.json edited by hand, which does not change the layers. The model is loaded as it was "
            "saved; to run every layer at another B, set .b on each B-cos layer "
            "(bcos_plugins.nn.linear.AlignmentPressure) after loading.", UserWarning, stacklevel=3)
    return layers, without_b


# from_pretrained's own options that share a name with a configuration attribute
_LOADING_OPTIONS = frozenset({"dtype", "torch_dtype", "attn_implementation", "experts_implementation"})
# options from_pretrained reads from its **kwargs (its docstring lists them), named in the fix of a misspelt keyword
_FROM_PRETRAINED_OPTIONS = _LOADING_OPTIONS | {"device_map", "max_memory", "offload_folder", "quantization_config",
                                               "subfolder", "variant", "key_mapping"}
# what sets the classifier head's shape, which the saved weights fix
_LABEL_SETTINGS = ("num_labels", "id2label", "label2id")
# the configuration attributes a load may set to another value than the saved one: what the forward returns or
# caches, not what it computes (the documented run-time flags of transformers' PretrainedConfig), and the head's tying,
# which _check_head_tying holds to the saved weights. Any other attribute (num_attention_heads, rope_theta, hidden_act,
# layer_norm_eps, pad_token_id, ...) builds another model that the saved weights fit without a shape error, silently
_RUN_TIME_SETTINGS = frozenset({"output_attentions", "output_hidden_states", "use_cache", "return_dict",
                                "tie_word_embeddings"})


def _changes_training_only(key: str) -> bool:
    """Whether a configuration attribute changes only training, never an evaluation's outputs: the dropout rates
    (``hidden_dropout_prob``, ``attention_dropout``, GPT-2's ``resid_pdrop``, ...), inactive in eval mode, and
    ``problem_type``, which picks the loss. A user fine-tuning a loaded model sets them as with ``from_pretrained``
    (the lead's decision, 2026-11-29: the maths of an explanation stay the saved model's)."""
    return key == "problem_type" or "dropout" in key or key.endswith("_pdrop")
# from_pretrained's arguments that load_bcos_model sets itself, each with what it does about it and the fix: a second
# value was Python's bare "got multiple values for keyword argument" TypeError
_SET_BY_LOAD = {
    "pretrained_model_name_or_path": (
        "load_bcos_model passes its path argument to from_pretrained as pretrained_model_name_or_path",
        "Pass the folder (or hub id) as path, the first argument, and leave pretrained_model_name_or_path out"),
    "use_safetensors": (
        "load_bcos_model passes use_safetensors=True itself: it reads safetensors only, after checking that each "
        "weight file is there and complete",
        "Leave use_safetensors out; a checkpoint saved as pytorch_model.bin loads with load_bcos_model once you "
        + _pickled_weights_fix("folder/pytorch_model.bin", "folder")),
    "output_loading_info": (
        "load_bcos_model reads the loading info itself, refuses a load with a missing, unexpected or mismatched "
        "weight (the biases B-cos removes aside) and returns the model alone",
        "Leave output_loading_info out: a model it returns has every saved weight loaded"),
}

# from_pretrained's arguments for weights from elsewhere than the folder, which a B-cos load cannot take: a GGUF file
# failed deep inside transformers ("expected str, bytes or os.PathLike object, not NoneType")
_OTHER_WEIGHT_SOURCES = {
    "gguf_file": ("load_bcos_model reads the safetensors weights save_pretrained wrote into the folder, with the B each "
                  "layer stored; a GGUF file holds a (quantised) stock model's weights and no B",
                  "Leave gguf_file out; to B-cosify a GGUF model, load it with transformers' from_pretrained(..., "
                  "gguf_file=...) and call bcosify"),
    "state_dict": ("load_bcos_model reads the weights, and the B each B-cos layer stored, from the folder",
                   "Leave state_dict out; to put a state dict into a loaded B-cos model, call "
                   "model.load_state_dict(state_dict) after loading"),
    # transformers renamed the weights' keys, not the bcos_b entries read beside them: a mapping that moves one
    # layer's weights onto another (swapping two layers) ran each at the other's B, silently
    "key_mapping": ("load_bcos_model pairs each layer's weights with the B stored under the same name, and "
                    "key_mapping would rename the weights alone (a layer's weights could run at another layer's B)",
                    "Leave key_mapping out; rename the keys in the folder's safetensors file(s), each layer's "
                    "'<layer>.bcos_b' entry with its weights, save them again (safetensors.torch.save_file) and load "
                    "that folder"),
}

# bcosify's own keywords, which a load takes from the save (config.bcos and each layer's stored B): they were refused as
# unknown ("neither an attribute of the saved configuration nor a from_pretrained option"), without the way to get
# what was asked
_CONVERSION_SETTINGS = {
    "b": ("the B-cos layers run at the B stored with each of them (config.bcos['b'] for a format-1 save), which "
          "load_bcos_model reads from the folder",
          "Leave b out, and set .b on each B-cos layer (bcos_plugins.nn.linear.AlignmentPressure) after loading to run "
          "at another B (bcos_plugins.train.BWarmupCallback anneals it while training)"),
    "bcos_query_key": ("the query/key choice is part of the saved model (config.bcos['query_key']), whose weights were "
                       "trained with it", "Leave bcos_query_key out: the model loads as it was saved; for the other "
                       "choice, convert the stock model with bcosify(model, bcos_query_key=...)"),
}


def _apply_config_overrides(path: str, config, kwargs: dict) -> dict:
    """Set the configuration attributes among ``kwargs`` on ``config`` (as ``from_pretrained`` does when it
    reads the configuration itself) and return the other keywords; refuse those that would change the head or
    the saved configuration, and the ``from_pretrained`` arguments ``load_bcos_model`` sets itself (every refusal a
    :class:`~bcos_plugins.errors.BcosKeywordError`).

    ``load_bcos_model`` hands transformers a configuration object, and transformers then passes every keyword
    on to the model's constructor, which fails on a configuration attribute (``TypeError`` from deep inside).
    """
    for key in ("config", BCOS_CONFIG_KEY):
        if key in kwargs:
            raise argument_error(key, "load_bcos_model reads the configuration saved in the folder (config.bcos "
                                 "records how the model was converted)", f"leave {key} out; change attributes of "
                                 "model.config after loading, or pass them as keywords (e.g. output_attentions=True)",
                                 kind=BcosKeywordError)
    for key, (problem, fix) in {**_SET_BY_LOAD, **_CONVERSION_SETTINGS, **_OTHER_WEIGHT_SOURCES}.items():
        if key in kwargs:
            raise argument_error(key, problem, fix, kind=BcosKeywordError)
    labels = next((k for k in _LABEL_SETTINGS if k in kwargs), None)
    if labels is not None:
        raise argument_error(
            labels, f"{path} was saved with {config.num_labels} labels (a classifier's head has that shape), and "
            "load_bcos_model rebuilds the saved model as it was", "leave it out; for other classes, "
            "load this model and fine-tune it with a new head, or B-cosify the stock model built with the labels "
            "you need", kind=BcosKeywordError)
    saved = config.to_dict()
    rest = {}
    for key, value in kwargs.items():
        if key in saved and key not in _LOADING_OPTIONS:
            if key not in _RUN_TIME_SETTINGS and not _changes_training_only(key) and not _same_setting(value, saved[key]):
                raise argument_error(
                    key, f"is {value!r}, but {path} was saved with {key}={saved[key]!r}: the saved weights would load "
                    "into another model (its maths, not its shapes, differ), silently; load_bcos_model sets only the "
                    f"run-time attributes {sorted(_RUN_TIME_SETTINGS)}, the training-only ones (dropout rates, problem_type) "
                    "and from_pretrained's loading options "
                    f"({', '.join(sorted(_LOADING_OPTIONS))})", f"leave {key} out: the model loads as it was saved. "
                    f"For a B-cos model with another {key}, build the stock model with it in its config and convert it "
                    "again with bcosify (then fine-tune); for a stock model, load it with transformers' "
                    "from_pretrained", kind=BcosKeywordError)
            setattr(config, key, value)
        else:
            rest[key] = value
    return rest


# from_pretrained's loading options that are names (strings) or None: another type failed inside transformers, naming
# neither the keyword nor the fix (attn_implementation=3: "'int' object has no attribute 'startswith'")
_NAME_OPTIONS = {
    "attn_implementation": "an attention implementation such as 'eager' or 'sdpa'",
    "variant": "the suffix save_pretrained(folder, variant=...) put into the weight file names, such as 'fp16'",
}


def _refuse_mistyped_loading_options(kwargs: dict) -> None:
    """Refuse a loading option of :data:`_NAME_OPTIONS` that is not a string (or None), naming it, and a ``device_map``
    that names a device this machine lacks (:func:`_refuse_unavailable_devices`)."""
    for key, what in _NAME_OPTIONS.items():
        value = kwargs.get(key)
        if value is not None and not isinstance(value, str):
            raise argument_error(key, f"must be {what}, got {type(value).__name__} {value!r}",
                                 f"Pass {key} as a string, or leave it out", kind=BcosKeywordError)
    if "device_map" in kwargs:
        _refuse_unavailable_devices(kwargs["device_map"])


def _refuse_unavailable_devices(device_map) -> None:
    """Refuse a ``device_map`` (a device, or a dict of them) naming a device this machine lacks, with the package's one
    device check (:func:`~bcos_plugins._checks.require_available_device`): ``device_map="cuda"`` on a machine without
    CUDA failed with torch's bare "AssertionError: Torch not compiled with CUDA enabled", and ``device_map=0`` or
    ``"mps"`` was reported as "path: transformers could not load ... re-save the model", naming the one argument that
    was right. Names that are no device (``"auto"``, ``"disk"``, a typo) are left to transformers, whose refusal is
    named by the load."""
    from ._checks import available_devices, require_available_device

    entries = device_map.items() if isinstance(device_map, dict) else [(None, device_map)]
    for key, value in entries:
        name = "device_map" if key is None else f"device_map[{key!r}]"
        if isinstance(value, bool) or not isinstance(value, str | int | torch.device):
            continue
        try:
            device = torch.device(value)
        except (RuntimeError, TypeError):
            if isinstance(value, int):  # torch reads an int as an index of the machine's accelerator
                raise argument_error(name, f"is {value}, an accelerator index, but this machine has no accelerator "
                                     f"(available: {', '.join(available_devices())})",
                                     "Pass an available device, e.g. device_map='cpu'", kind=BcosKeywordError) from None
            continue
        try:
            require_available_device(name, device)
        except BcosError as error:
            raise BcosKeywordError(str(error)) from None


# what transformers' refusal of a loading option's value says instead of the option's name
_REFUSAL_WORDING = {"attn_implementation": "attention implementation"}


def _keyword_refused(err: Exception, keywords: dict) -> str | None:
    """The keyword of ``keywords`` whose value transformers' error ``err`` refuses, read from its message (the
    option's name, or :data:`_REFUSAL_WORDING`'s phrase for it); ``None`` when it names none."""
    text = str(err)
    return next((key for key in keywords if key in text or (key in _REFUSAL_WORDING and _REFUSAL_WORDING[key] in text)),
                None)


def _same_setting(value, saved) -> bool:
    """Whether a keyword's ``value`` is the saved configuration's ``saved`` (so setting it changes nothing)."""
    try:
        return bool(value == saved) and type(value) is type(saved)
    except Exception:  # noqa: BLE001 - a value that cannot be compared (an array) is not the saved one
        return False


def _config_property_fields(config, key: str) -> list[str] | None:
    """The saved fields (``config.to_dict()``'s) that a property ``key`` of the configuration's class reads
    (``self.<field>`` in its getter's source); ``None`` when ``key`` is no such property."""
    prop = getattr(type(config), key, None)
    if not isinstance(prop, property) or prop.fget is None or key.startswith("_"):
        return None
    try:
        source = inspect.getsource(prop.fget)
    except (OSError, TypeError):
        return []
    saved = config.to_dict()
    return sorted({f for f in re.findall(r"self\.(\w+)", source) if f in saved and f != key})


def _unknown_keyword_error(key: str, config, model_class) -> BcosKeywordError:
    """The refusal of a keyword that is neither an attribute of the saved configuration nor a ``from_pretrained``
    option: transformers hands it on to the model's constructor, which fails with a bare ``TypeError``."""
    derived = _config_property_fields(config, key)
    if derived is not None:
        # a property of the configuration class (ModernBERT's sliding_window), computed from saved fields: it was
        # refused as "neither an attribute of the saved configuration nor an option", which it reads as it is
        fields = ", ".join(f"{f}={getattr(config, f)!r}" for f in derived) or "other fields"
        return argument_error(key, f"is a property of {type(config).__name__} computed from its saved field(s) "
                              f"{fields} (here {key}={getattr(config, key, None)!r}), not a field a load can set: the "
                              "saved weights were trained with it", f"Leave {key} out: the model loads as it was saved. "
                              f"For another {key}, build the stock model with other {' / '.join(derived) or 'fields'} "
                              "in its config and convert it again with bcosify (then fine-tune)",
                              kind=BcosKeywordError)
    named = {p.name for p in inspect.signature(model_class.from_pretrained).parameters.values()
             if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    # never suggest a keyword that load_bcos_model refuses
    # (of the configuration's attributes, only the run-time ones: _apply_config_overrides refuses the others)
    known = (((set(config.to_dict()) & _RUN_TIME_SETTINGS) | named | _FROM_PRETRAINED_OPTIONS) - set(_SET_BY_LOAD)
             - set(_CONVERSION_SETTINGS) - set(_OTHER_WEIGHT_SOURCES) - {"config", BCOS_CONFIG_KEY})
    fix = closest_name_fix(key, known, "Pass attributes of the saved configuration (e.g. output_attentions=True) or "
                           "from_pretrained options (e.g. dtype=torch.bfloat16, device_map='auto')")
    return argument_error(key, f"is neither an attribute of the saved {type(config).__name__} nor an option of "
                          f"{model_class.__name__}.from_pretrained, so load_bcos_model cannot use it", fix,
                          kind=BcosKeywordError)


def _load_reporting(load, path: str, keywords: dict, config, model_class):
    """``load()`` with transformers' load report kept off the console and quoted in our errors; a keyword of
    ``keywords`` that the model's constructor refuses is named with the closest valid one."""
    capture = _LogCapture()
    hf_logger = logging.getLogger("transformers.modeling_utils")
    level, propagate = hf_logger.level, hf_logger.propagate
    hf_logger.addHandler(capture)
    # The report is expected to list the biases B-cos removes and the bcos_b entries the stock class lacks;
    # it is kept off the console and quoted in the error below if anything else is wrong.
    # Just below WARNING: the report (a warning) is emitted, but transformers' tensor-parallel plan check,
    # which runs when this logger's own level is WARNING or above, stays off (it warns on every B-cos load).
    hf_logger.setLevel(logging.WARNING - 1)
    hf_logger.propagate = False
    try:
        return load()
    except BcosError:  # a refusal of the model's own from_pretrained already names the problem
        raise
    except TypeError as err:
        refused = next((key for key in keywords if f"unexpected keyword argument '{key}'" in str(err)), None)
        if refused is None:
            raise
        raise _unknown_keyword_error(refused, config, model_class) from None
    except (RuntimeError, OSError, ValueError) as err:
        problems = capture.problems()
        refused = None if problems else _keyword_refused(err, keywords)
        if refused is not None:
            # transformers refused a keyword's value (dtype=torch.int8, attn_implementation="sdpa" for a class without
            # it, device_map="bogus"): the error named path, the one argument that was right, and said to re-save
            raise argument_error(
                refused, f"is {keywords[refused]!r}, which transformers refused while loading {path} "
                f"({type(err).__name__}: {err})", f"Pass another {refused}, as transformers' message says, or leave "
                f"{refused} out", kind=BcosKeywordError) from err
        if not problems:
            raise BcosValueError(f"path: transformers could not load {path} ({type(err).__name__}: {err}). Check "
                                 "the from_pretrained keyword arguments, or re-save the model.") from err
        raise BcosValueError(
            f"path: the weights in {path} do not fit its config.json; transformers reports: "
            + "; ".join(problems) + ". Restore the folder from the original save_pretrained (config.json and "
            "the safetensors files must come from the same model; a changed num_labels changes the "
            "classifier's shape)."
        ) from None
    finally:
        hf_logger.removeHandler(capture)
        hf_logger.setLevel(level)
        hf_logger.propagate = propagate


def _saved_model_type(path: str, local: bool) -> str | None:
    """``model_type`` of config.json read as plain JSON (AutoConfig does not know the package's own types)."""
    if not local:
        return None
    try:
        with open(os.path.join(path, "config.json")) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None  # AutoConfig reports the unreadable file below, with the path
    return data.get("model_type") if isinstance(data, dict) else None


def _load_vit(path: str, kwargs: dict) -> nn.Module:
    """A saved :class:`~bcos_plugins.vision.BcosViT`, refused if any weight it needs is missing or unexpected."""
    from .vision import BcosViT, BcosViTConfig

    try:
        config = BcosViTConfig.from_pretrained(path)
    except (OSError, ValueError, TypeError) as err:
        raise BcosFileError(f"path: cannot read a BcosViT configuration from {path}/config.json ({err}). "
                            "Restore config.json from the original save.") from None
    kwargs = _apply_config_overrides(path, config, kwargs)
    _refuse_mistyped_loading_options(kwargs)
    weight_files(path, True, kwargs.get("variant"))
    # BcosViT.from_pretrained itself refuses missing, unexpected and mismatched weights, naming them
    model = _load_reporting(lambda: BcosViT.from_pretrained(path, config=config, use_safetensors=True, **kwargs),
                            path, kwargs, config, BcosViT)
    return model.eval()


def _output_embedding_key(model: nn.Module) -> str | None:
    """The state-dict key of ``model``'s LM head weight (``lm_head.weight``, ``cls.predictions.decoder.weight``), or
    ``None`` for a model without one."""
    try:
        head = model.get_output_embeddings()
    except NotImplementedError:
        return None
    if head is None:
        return None
    return next((f"{name}.weight" for name, module in model.named_modules() if module is head and name), None)


def _check_head_tying(model: nn.Module, info: dict, path: str, tie_asked: bool) -> None:
    """Refuse, with the cause and the fix, the two loads where the LM head's tying and the weights disagree.

    - The save holds no head weight while its config says ``tie_word_embeddings=False``: the head was tied to the
      input embeddings by hand (``lm_head.weight = embed_tokens.weight``) under an untied config, and save_pretrained
      wrote the shared tensor once, under the embeddings' name. transformers initialises such a head at random; the
      load refused it telling to "restore the folder from the original save", which was that save.
    - ``tie_word_embeddings=True`` given to a save whose head has weights of its own: the refusal came from bcosify
      and named the model's config as the fix, not the keyword.
    """
    key = _output_embedding_key(model)
    if key is None:
        return
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    if key in info["missing_keys"] and not tied and not getattr(model.config, "tie_word_embeddings", True) and tie_asked:
        # the keyword untied a head saved tied: the refusal below blamed the folder's config.json, which says True
        raise argument_error(
            "tie_word_embeddings", f"is False, but {path} holds no weights for the LM head ('{key}'): it was saved tied "
            "to the input embeddings (save_pretrained writes a tensor held at two places once), so an untied head "
            "would start from random weights", "leave tie_word_embeddings out: the model loads with its head tied, as "
            "saved (to train the head apart afterwards, give it a copy of the weights and set "
            "model.config.tie_word_embeddings = False)", kind=BcosKeywordError)
    if key in info["missing_keys"] and not tied and not getattr(model.config, "tie_word_embeddings", True):
        raise BcosValueError(
            f"path: {path} holds no weights for the LM head ('{key}') while its config.json says "
            "tie_word_embeddings=False: save_pretrained writes a tensor held at two places only once, so the head was "
            "the input embeddings' own weight when it was saved (tied by hand, e.g. lm_head.weight = "
            "embed_tokens.weight, under an untied config). Load it with load_bcos_model(path, "
            "tie_word_embeddings=True), which ties the head to the embeddings as it was saved; set "
            "model.config.tie_word_embeddings = True before saving such a model.")
    if tie_asked and not tied and getattr(model.config, "tie_word_embeddings", False) and key not in info["missing_keys"]:
        raise argument_error(
            "tie_word_embeddings", f"is True, but {path} was saved with an LM head of its own ('{key}' holds "
            "weights other than the input embeddings'), which tying would replace by the embeddings: another model",
            "leave tie_word_embeddings out: the model loads with its saved head", kind=BcosKeywordError)


def _refuse_lost_record(path: str, local: bool, variant, hub: dict) -> None:
    """Refuse, naming the cause, a folder whose config.json has no ``config.bcos`` while its weights hold the B each
    B-cos layer stored: a B-cos model saved after its record was lost (``model.config`` replaced, or ``config.bcos``
    deleted, after bcosify). It was refused as "not saved from a model converted with bcosify. Load it with
    transformers and call bcosify instead", which is not so, and whose fix drops each layer's stored B."""
    try:
        files = weight_files(path, local, variant if isinstance(variant, str) else None, hub)
    except BcosError:
        return  # no readable weights: checked_settings' refusal stands
    stored = stored_pressures(files)
    if stored:
        raise BcosValueError(
            f"path: {path}/config.json has no B-cos settings (config.bcos), but its weights hold the B of "
            f"{len(stored)} B-cos layer(s) (bcos_b entries): a B-cos model saved after its record was lost "
            "(model.config replaced, or config.bcos deleted, after bcosify), which load_bcos_model cannot rebuild as "
            "converted (its query/key choice, activations and norm epsilons are in the record). Restore config.json "
            "from an earlier save of this model, or put the record back on the model before saving "
            "(model.config.bcos = the config.bcos of the model bcosify returned) and save again.")


def subfolder_path(path, subfolder, *, reader: str = "load_bcos_model") -> str:
    """The folder ``subfolder`` of the local folder ``path``, which the whole load reads: given to from_pretrained,
    ``subfolder`` took the weights from there and the record, each layer's stored B and the checks from ``path`` (a
    Trainer run's checkpoint-500 loaded with the final model's B, logits 0.39 off, silently). The one reading of
    ``subfolder`` for every B-cos load (:func:`load_bcos_model`, the inseq adapter's); ``reader`` names the caller."""
    if not isinstance(subfolder, str | os.PathLike):
        raise argument_error("subfolder", f"must be a folder name (str), got {type(subfolder).__name__}",
                             "pass the name of the folder inside path, e.g. subfolder='checkpoint-500'",
                             kind=BcosTypeError)
    if isinstance(path, str | os.PathLike) and Path(os.path.expanduser(os.fspath(path))).is_dir():
        return os.path.join(os.fspath(path), os.fspath(subfolder))
    raise argument_error("subfolder", f"is given with {os.fspath(path) if isinstance(path, str | os.PathLike) else path!r}, "
                         f"which is no local folder: {reader} reads a hub repository's top folder only",
                         "download the repository (huggingface_hub.snapshot_download) and pass its folder joined with "
                         "the subfolder as path", kind=BcosKeywordError)


# under a caller's torch.inference_mode() the loaded parameters would be inference tensors, which bcosify refuses (no
# B-cos model made of them can be explained or trained): the model is loaded with ordinary tensors whatever the mode
@torch.inference_mode(False)
def load_bcos_model(path: str | Path, **from_pretrained_kwargs) -> nn.Module:
    """Reload a B-cos model written by ``model.save_pretrained(path)`` (safetensors only).

    The stock architecture recorded in ``config.bcos`` is loaded with transformers' own
    ``from_pretrained`` (sharding, dtype and device options work), converted again, and checked: the only
    weights transformers may report missing are the biases B-cos removes. Every B-cos layer gets the B
    stored with it (format 2: the B it was running with when saved, also mid-way through a B warm-up);
    format-1 folders, which stored one B in ``config.bcos["b"]``, load at that B. Where a stored B differs from
    ``config.bcos["b"]`` (a save made during a warm-up, or a config.json edited by hand) a ``UserWarning`` names
    both: the layers run at the stored B, the edit does not change them. A folder saved from a
    :class:`~bcos_plugins.vision.BcosViT` loads as one, with every weight required. A keyword that names an
    attribute of the saved configuration sets it only where it changes what the forward returns, not what it computes:
    ``output_attentions``, ``output_hidden_states``, ``use_cache``, ``return_dict`` and ``tie_word_embeddings`` (held
    to the saved head's weights); any other (``num_attention_heads=8``, ``rope_theta``, ``hidden_act``,
    ``layer_norm_eps``, ``pad_token_id``, ...) is refused unless it repeats the saved value, because the saved weights
    would load without a shape error into a model whose maths differ (to get one, convert the stock model built with
    that setting again with bcosify). The others (``dtype``, ``attn_implementation``, ``device_map``, ...) go to
    ``from_pretrained``, a value it refuses named with its message; ``variant`` loads the weights and each layer's B
    from ``model.<variant>.safetensors`` (or its sharded index); ``subfolder`` names a folder inside a local
    ``path``, which the whole load then reads (a Trainer run's ``checkpoint-500``). The model is returned in eval
    mode, made of ordinary tensors also when called under ``torch.inference_mode()``.

    Raises:
        BcosFileError: no such folder (or hub id), no config.json, no or an empty / truncated safetensors
            file (named).
        BcosValueError: not a B-cos model, an unknown or edited ``config.bcos`` (format version, architecture,
            query/key), weights that do not fit the configuration (wrong shapes, a changed ``num_labels``:
            transformers' load report is quoted) or are missing, or weights holding a bias the recorded conversion
            drops (a stock model's, or a save whose ``config.bcos`` was edited: no B-cos save holds one).
        BcosKeywordError: a keyword it does not accept, each refused by name: one that would change the saved head
            (``num_labels``, ``id2label``, ``label2id``), replace the saved configuration (``config``, ``bcos``) or
            set an attribute of it to another value than the saved one, other than the run-time ones above,
            one of the ``from_pretrained`` arguments it sets itself (``pretrained_model_name_or_path``,
            ``use_safetensors``, ``output_loading_info``: the message says what it does about each) or that takes
            weights from elsewhere or renames them apart from each layer's stored B (``gguf_file``, ``state_dict``,
            ``key_mapping``), a property of the configuration class computed from saved fields (ModernBERT's
            ``sliding_window``: the message names the fields), or one that is neither a configuration attribute
            nor a ``from_pretrained`` option (a typo: the message names the closest valid one). One class for every keyword refusal: a ``TypeError``, as Python's refusal of an
            unexpected keyword is, and also a ``ValueError`` (:class:`~bcos_plugins.errors.BcosValueError`),
            which 0.2.0 raised for the head and configuration keywords.
    """
    from transformers import AutoConfig

    if "subfolder" in from_pretrained_kwargs:
        path = subfolder_path(path, from_pretrained_kwargs.pop("subfolder"))
    path, local = checked_folder(path)
    if _saved_model_type(path, local) == _VIT_MODEL_TYPE:
        return _load_vit(path, from_pretrained_kwargs)
    hub = {} if local else hub_options(from_pretrained_kwargs)
    try:
        config = AutoConfig.from_pretrained(path, **hub)
    except (OSError, ValueError) as err:
        where = os.path.join(path, "config.json") if local else path
        raise BcosFileError(f"path: cannot read a model configuration from {where} ({err}). Pass the folder "
                            "written by model.save_pretrained(folder) (or a hub model id).") from None
    if not isinstance(getattr(config, BCOS_CONFIG_KEY, None), dict):
        _refuse_lost_record(path, local, from_pretrained_kwargs.get("variant"), hub)
    settings = checked_settings(path, config)
    asked = set(from_pretrained_kwargs)
    from_pretrained_kwargs = _apply_config_overrides(path, config, from_pretrained_kwargs)
    _refuse_mistyped_loading_options(from_pretrained_kwargs)
    # the files of the variant from_pretrained loads: each layer's stored B is read from them
    files = weight_files(path, local, from_pretrained_kwargs.get("variant"), hub)
    name = settings["architecture"]
    model, info = _load_reporting(
        lambda: stock_class(name).from_pretrained(path, config=config, use_safetensors=True,
                                                  output_loading_info=True, **from_pretrained_kwargs),
        path, from_pretrained_kwargs, config, stock_class(name))
    _check_head_tying(model, info, path, "tie_word_embeddings" in asked)
    layers, without_b = reconvert_stock_load(model, path, settings, files)
    dropped = set(model.bcos_report.dropped_biases)
    unexpected_missing = [k for k in info["missing_keys"] if k not in dropped]
    unexpected = [k for k in info["unexpected_keys"] if not (k.endswith(".bcos_b") and k[:-7] in layers)]
    if without_b and not (unexpected_missing or unexpected or info.get("mismatched_keys")):
        # the weights fit, but no B was saved with these layers: the saved model held no B-cos layer there (a head
        # replaced by a plain nn.Linear after bcosify), and the load said to restore a folder that was the save
        raise BcosValueError(
            f"path: {path} does not match a B-cos {name}: B-cos layers without a stored B {without_b}, while a save "
            "stores one with each B-cos layer: the saved model held another module there (e.g. a head replaced by a "
            "plain nn.Linear after bcosify), which the load would rebuild as a B-cos layer, another model, or the "
            "weight files were edited. Put a B-cos layer there before saving (bcos_plugins.nn.BcosLinear.from_linear("
            "layer, b=model.config.bcos['b'])) and save again, or restore the folder from the original save_pretrained.")
    if unexpected_missing or unexpected or info.get("mismatched_keys") or without_b:
        raise BcosValueError(
            f"path: {path} does not match a B-cos {name}: missing {sorted(unexpected_missing)}, unexpected "
            f"{sorted(unexpected)}, mismatched {info.get('mismatched_keys')}, B-cos layers without a stored B "
            f"{without_b}. Restore the folder from the original save_pretrained."
        )
    model.eval()
    return model
